import AppleSimulator
import BrokerCore
import BrokerCrypto
import Foundation
import HTTPClient
import JOSE
import PostgresClient
import StrictJSON
import TestSupport
import Testing

@testable import OpenIDProvider

/// The session at the provider (issue 36 item 4): a sign-in at Apple leaves a `__Host-` cookie;
/// while it lives, authorizations are answered without Apple (single sign-on, `prompt=none`),
/// `max_age`, `prompt=login` and `id_token_hint` send the browser back to Apple when they must,
/// `auth_time` is Apple's and `sid` the session's; Apple's events end it; it is bounded.
@Suite("OpenID Provider sessions", .offPool)
struct SessionTests {
    func request(_ client: ProviderHarness.RegisteredClient, _ extra: [(String, String)] = []) -> [(String, String)] {
        [
            ("response_type", "code"), ("client_id", client.id), ("redirect_uri", client.redirectURI),
            ("scope", "openid email"), ("state", "s-1"), ("nonce", "n-1"),
        ] + extra
    }

    /// The code of a query-mode answer.
    func code(_ answer: SessionBrowser.Answer, sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
        guard case .query(let redirect) = answer else {
            Issue.record("not a redirect to the RP: \(answer)", sourceLocation: sourceLocation)
            throw CancellationError()
        }
        return try #require(redirect.query["code"], "\(redirect.query)", sourceLocation: sourceLocation)
    }

    /// The ID token's verified claims for a code.
    func claims(_ harness: ProviderHarness, _ client: ProviderHarness.RegisteredClient, code: String) throws -> [String:
        JSONValue]
    {
        let answer = try harness.token(
            [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)], as: client)
        #expect(answer.status == 200, "\(answer.bodyText)")
        return try harness.verifiedClaims(try #require(answer.json["id_token"] as? String))
    }

    /// The Apple `sub` of the person behind a broker user id (the simulator signs them in again with it).
    func appleSub(_ harness: ProviderHarness, _ claims: [String: JSONValue]) throws -> [(String, String)] {
        let userID = try #require(claims["sub"]?.stringValue.flatMap(UUID.init(uuidString:)))
        return [
            (
                "sim_sub",
                try harness.pool.query("SELECT sub FROM apple_identities WHERE user_id = \(userID)").single().decode(
                    String.self, "sub")
            )
        ]
    }

    func error(_ answer: SessionBrowser.Answer) -> String? {
        if case .query(let redirect) = answer { return redirect.query["error"] }
        return nil
    }

    @Test(
        "a sign-in leaves a __Host- session cookie; prompt=none then answers at once, at another RP too, with Apple's auth_time and the session's sid"
    )
    func singleSignOn() throws {
        let harness = try ProviderHarness(extra: ["OIDC_SESSION_SECONDS": "3600"])
        let first = try harness.confidentialClient()
        let second = try harness.confidentialClient(redirectURI: "https://other-rp.example.com/cb")
        let browser = SessionBrowser(harness)
        // Apple's own session let the person through 30 s before the token (sim_auth_age).
        let (answer, viaApple) = try browser.signIn(request(first), sim: [("sim_auth_age", "30")])
        #expect(viaApple)
        let cookie = try #require(browser.setCookies.last)
        for attribute in ["Path=/", "Max-Age=3600", "Secure", "HttpOnly", "SameSite=None"] {
            #expect(cookie.contains(attribute), "\(cookie)")
        }
        #expect(!cookie.contains("Domain"), "__Host-: this host only")
        let firstClaims = try claims(harness, first, code: try code(answer))
        let authTime = try #require(firstClaims["auth_time"]?.integerValue)
        let iat = try #require(firstClaims["iat"]?.integerValue)
        #expect(iat - authTime >= 29, "auth_time is when Apple authenticated the person, not when the broker issued the code")

        let apple = harness.simulator.statistics
        let silent = try browser.signIn(request(first, [("prompt", "none")]))
        #expect(!silent.viaApple, "a live session answers without Apple")
        let silentClaims = try claims(harness, first, code: try code(silent.0))
        #expect(silentClaims["auth_time"]?.integerValue == authTime)
        #expect(silentClaims["sid"] == firstClaims["sid"])
        #expect(silentClaims["sub"] == firstClaims["sub"])
        #expect(silentClaims["nonce"]?.stringValue == "n-1")
        // Single sign-on: another relying party, no prompt at all, no Apple.
        let other = try browser.signIn(request(second))
        #expect(!other.viaApple)
        let otherClaims = try claims(harness, second, code: try code(other.0))
        #expect(otherClaims["sid"] == firstClaims["sid"], "one session, one sid across relying parties")
        #expect(otherClaims["sub"] == firstClaims["sub"])
        #expect(
            harness.simulator.statistics.token == apple.token && harness.simulator.statistics.authorize == apple.authorize,
            "no code went to Apple")

        // Another browser (no cookie), a cookie nobody issued, an over-long one: login_required.
        for stranger in [nil, Base64URL.encode(SecureRandom.bytes(32)), String(repeating: "a", count: 5000)] {
            let other = SessionBrowser(harness)
            other.session = stranger
            #expect(error(try other.answer(try other.authorize(request(first, [("prompt", "none")])))) == "login_required")
        }
        let metrics = try harness.send("GET", "/metrics").bodyText
        #expect(metrics.contains(#"oidc_session_authorizations_total{outcome="success"} 2"#), "\(metrics)")
    }

    @Test(
        "max_age older than the session, prompt=login and an id_token_hint for someone else go back to Apple; a young enough session does not"
    )
    func backToApple() throws {
        let harness = try ProviderHarness(extra: ["OIDC_SESSION_SECONDS": "3600"])
        let client = try harness.confidentialClient()
        let browser = SessionBrowser(harness)
        let (first, _) = try browser.signIn(request(client), sim: [("sim_auth_age", "20")])
        let firstClaims = try claims(harness, client, code: try code(first))
        let sessionCookie = browser.session

        // max_age=10000: the session is young enough.
        let young = try browser.signIn(request(client, [("max_age", "10000")]))
        #expect(!young.viaApple)
        #expect(try claims(harness, client, code: try code(young.0))["auth_time"] == firstClaims["auth_time"])
        // max_age=10: Apple authenticated the person 20 s ago: back to Apple; with prompt=none, login_required.
        #expect(
            error(try browser.answer(try browser.authorize(request(client, [("max_age", "10"), ("prompt", "none")]))))
                == "login_required")
        let person = try appleSub(harness, firstClaims)
        let old = try browser.signIn(request(client, [("max_age", "10")]), sim: person)
        #expect(old.viaApple)
        let renewed = try claims(harness, client, code: try code(old.0))
        #expect(try #require(renewed["auth_time"]?.integerValue) > (firstClaims["auth_time"]?.integerValue ?? .max))
        #expect(renewed["sid"] == firstClaims["sid"], "the same person's session is renewed, not replaced")
        #expect(browser.session != sessionCookie, "a new secret after each sign-in at Apple")
        // prompt=login always goes to Apple.
        #expect(try browser.signIn(request(client, [("prompt", "login")]), sim: person).viaApple)

        // id_token_hint: this person's ID token: silent; a malformed one: invalid_request.
        let idToken = try #require(
            try harness.token(
                [
                    ("grant_type", "authorization_code"), ("code", try code(try browser.signIn(request(client)).0)),
                    ("redirect_uri", client.redirectURI),
                ], as: client
            ).json["id_token"] as? String)
        let hinted = try browser.signIn(request(client, [("prompt", "none"), ("id_token_hint", idToken)]))
        #expect(!hinted.viaApple)
        _ = try code(hinted.0)
        let forged = idToken.dropLast(4) + "AAAA"
        #expect(
            error(try browser.answer(try browser.authorize(request(client, [("id_token_hint", String(forged))]))))
                == "invalid_request")
        // Another person's ID token as the hint: not this session's person.
        let stranger = SessionBrowser(harness)
        let strangerToken = try #require(
            try harness.token(
                [
                    ("grant_type", "authorization_code"), ("code", try code(try stranger.signIn(request(client)).0)),
                    ("redirect_uri", client.redirectURI),
                ], as: client
            ).json["id_token"] as? String)
        #expect(
            error(
                try browser.answer(
                    try browser.authorize(request(client, [("prompt", "none"), ("id_token_hint", strangerToken)]))))
                == "login_required")
        // max_age that is not a number of seconds.
        #expect(error(try browser.answer(try browser.authorize(request(client, [("max_age", "-1")])))) == "invalid_request")
    }

    @Test(
        "the Apple leg is bound to the browser that started it: Apple's form post replayed from another browser signs nobody in there"
    )
    func appleLegBoundToBrowser() throws {
        let harness = try ProviderHarness(extra: ["OIDC_SESSION_SECONDS": "3600"])
        let client = try harness.confidentialClient()
        // Login CSRF: the attacker starts an authorization and signs in at Apple as themself,
        // then makes the victim's browser post Apple's answer to the broker's callback.
        let attacker = SessionBrowser(harness)
        let form = try attacker.appleForm(request(client))
        let victim = SessionBrowser(harness)
        let replayed = try victim.post("/v1/apple/web/callback", form: form)
        #expect(replayed.status == 400, "\(replayed.status) \(replayed.bodyText)")
        #expect(replayed.header("location") == nil, "no code for the RP")
        #expect(victim.session == nil, "no session at the provider in the victim's browser")
        #expect(error(try victim.answer(try victim.authorize(request(client, [("prompt", "none")])))) == "login_required")
        let binding = try #require(
            attacker.cookies.first { $0.key.hasPrefix("__Host-") && $0.key != SessionBrowser.cookie },
            "the authorization leaves a __Host- binding cookie: \(attacker.cookies)")
        #expect(binding.value.count == 43)
        // A wrong binding is refused alike; the browser that started it still finishes it.
        let stranger = SessionBrowser(harness)
        stranger.cookies[binding.key] = Base64URL.encode(SecureRandom.bytes(32))
        #expect(try stranger.post("/v1/apple/web/callback", form: form).status == 400)
        let finished = try attacker.answer(try attacker.post("/v1/apple/web/callback", form: form))
        _ = try claims(harness, client, code: try code(finished))
        #expect(attacker.session != nil)
        // Two authorizations under way in one browser (two tabs, two RPs) share the binding.
        let tab = SessionBrowser(harness)
        let firstTab = try tab.appleForm(request(client, [("prompt", "login")]))
        let secondTab = try tab.appleForm(request(client, [("prompt", "login")]))
        for form in [firstTab, secondTab] {
            _ = try claims(harness, client, code: try code(try tab.answer(try tab.post("/v1/apple/web/callback", form: form))))
        }
    }

    @Test("OIDC_SESSION_SECONDS=0 turns sessions off: no cookie, prompt=none is login_required; a bad value stops the start")
    func sessionsOff() throws {
        for bad in ["-1", "7776001", "week"] {
            let refused = #expect(throws: BrokerConfiguration.Invalid.self) {
                _ = try BrokerConfiguration.load(
                    environment: [
                        "OIDC_ISSUER": "https://id.example.com", "OIDC_APPLE_CLIENT_ID": "com.example.web",
                        "BROKER_PUBLIC_URL": "https://broker.example.com", "OIDC_SESSION_SECONDS": bad,
                    ], requireApple: false)
            }
            #expect(refused?.description.contains("OIDC_SESSION_SECONDS") == true, "\(bad)")
        }
        let harness = try ProviderHarness(extra: ["OIDC_SESSION_SECONDS": "0"])
        let client = try harness.confidentialClient()
        let browser = SessionBrowser(harness)
        let (answer, _) = try browser.signIn(request(client))
        _ = try claims(harness, client, code: try code(answer))
        #expect(browser.setCookies.isEmpty)
        #expect(error(try browser.answer(try browser.authorize(request(client, [("prompt", "none")])))) == "login_required")
        #expect(try harness.count("SELECT count(*) FROM oidc_sessions") == 0)
    }

    @Test("Apple's consent-revoked ends the person's sessions: prompt=none is login_required afterwards")
    func endedByApple() throws {
        let harness = try ProviderHarness(extra: ["OIDC_SESSION_SECONDS": "3600"], roles: "api,notifications")
        let client = try harness.confidentialClient()
        let browser = SessionBrowser(harness)
        let (answer, _) = try browser.signIn(request(client))
        let subject = try claims(harness, client, code: try code(answer))["sub"]?.stringValue
        let userID = try #require(subject.flatMap(UUID.init(uuidString:)))
        let appleSub = try harness.pool.query("SELECT sub FROM apple_identities WHERE user_id = \(userID)").single()
            .decode(String.self, "sub")
        _ = try code(try browser.signIn(request(client, [("prompt", "none")])).0)
        var notification = NotificationRequest(
            url: harness.baseURL + "/v1/apple/notifications", type: "consent-revoked", sub: appleSub, clientID: "com.example.app")
        notification.eventTimeMilliseconds = Int64(Date().timeIntervalSince1970 * 1000) + 1000
        #expect(try harness.simulator.sendNotification(notification).status == 200)
        #expect(error(try browser.answer(try browser.authorize(request(client, [("prompt", "none")])))) == "login_required")
        #expect(try harness.count("SELECT count(*) FROM oidc_sessions WHERE end_reason = 'consent.revoked'") == 1)
    }

    @Test(
        "bounded: one session per browser, at most 20 live ones per person (the oldest ends), and housekeeping deletes spent ones"
    )
    func bounded() throws {
        let harness = try ProviderHarness(extra: ["OIDC_SESSION_SECONDS": "3600"])
        let client = try harness.confidentialClient()
        let browser = SessionBrowser(harness)
        let (answer, _) = try browser.signIn(request(client))
        let subject = try claims(harness, client, code: try code(answer))["sub"]?.stringValue
        let userID = try #require(subject.flatMap(UUID.init(uuidString:)))
        // The same browser signing in again (the same person) keeps one row.
        let person = [
            (
                "sim_sub",
                try harness.pool.query("SELECT sub FROM apple_identities WHERE user_id = \(userID)").single().decode(
                    String.self, "sub")
            )
        ]
        _ = try browser.signIn(request(client, [("prompt", "login")]), sim: person)
        #expect(try harness.count("SELECT count(*) FROM oidc_sessions") == 1)
        // Twenty-five more browsers for this person (written as the callback would).
        let store = SessionStore(pool: harness.pool, appID: "com.example.app")
        var secrets: [String] = []
        for _ in 0..<25 {
            secrets.append(try store.signedIn(userID: userID, authTime: Date(), lifetimeSeconds: 3600, previousSecret: nil).1)
        }
        #expect(try harness.count("SELECT count(*) FROM oidc_sessions WHERE ended_at IS NULL") == 20)
        #expect(try store.find(secret: try #require(browser.session)) == nil, "the oldest session ended")
        #expect(try store.find(secret: try #require(secrets.last)) != nil)
        _ = try ProviderHousekeeping(pool: harness.pool, retention: .seconds(60), deadLetterRetention: .seconds(60)).prune()
        #expect(try harness.count("SELECT count(*) FROM oidc_sessions") == 20)
    }
}
