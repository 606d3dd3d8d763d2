import BrokerCrypto
import Foundation
import HTTPClient
import JOSE
import PostgresClient
import StrictJSON
import TestSupport
import Testing

@testable import OpenIDProvider

/// RP-Initiated Logout 1.0 and Back-Channel Logout (issue 36 items 5 and 7): the end-session
/// endpoint ends the hint's session and its grants, every relying party of that session gets
/// its logout token through the outbox, and the browser goes back only to a registered
/// post_logout_redirect_uri; what cannot be trusted gets a page. A receiver's 400 is final, and
/// a grant is kept for its logout as long as its session could live.
@Suite("OpenID Provider logout", .offPool)
struct LogoutTests {
    static let bye = "https://rp.example.com/bye"

    static func harness() throws -> ProviderHarness {
        try ProviderHarness(
            extra: [
                "OIDC_SESSION_SECONDS": "3600", "BROKER_DISPATCH_INTERVAL_MS": "20", "BROKER_WEBHOOK_RETRY_BASE_MS": "50",
            ], roles: "api,dispatch")
    }

    struct SignedIn {
        let access: String
        let refresh: String
        let idToken: String
        let claims: [String: JSONValue]
    }

    /// An authorization in `browser` (through Apple or from its session) and the token exchange.
    func signIn(_ harness: ProviderHarness, _ browser: SessionBrowser, _ client: ProviderHarness.RegisteredClient) throws
        -> SignedIn
    {
        let (answer, _) = try browser.signIn([
            ("response_type", "code"), ("client_id", client.id), ("redirect_uri", client.redirectURI),
            ("scope", "openid offline_access"), ("state", "s"),
        ])
        guard case .query(let redirect) = answer, let code = redirect.query["code"] else {
            Issue.record("no code: \(answer)")
            throw CancellationError()
        }
        let tokens = try harness.token(
            [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)], as: client
        ).json
        let idToken = try #require(tokens["id_token"] as? String)
        return SignedIn(
            access: try #require(tokens["access_token"] as? String), refresh: try #require(tokens["refresh_token"] as? String),
            idToken: idToken, claims: try harness.verifiedClaims(idToken))
    }

    func promptNone(_ browser: SessionBrowser, _ client: ProviderHarness.RegisteredClient) throws -> String? {
        let answer = try browser.answer(
            try browser.authorize([
                ("response_type", "code"), ("client_id", client.id), ("redirect_uri", client.redirectURI),
                ("scope", "openid"), ("prompt", "none"),
            ]))
        guard case .query(let redirect) = answer else { return "not a redirect" }
        return redirect.query["error"] ?? (redirect.query["code"] != nil ? "code" : nil)
    }

    func logout(_ browser: SessionBrowser, _ parameters: [(String, String)]) throws -> HTTPClientResponse {
        try browser.get("/oidc/logout?" + FormEncoding.encode(parameters))
    }

    @Test("an RP-initiated logout wakes the logout lane at once (NOTIFY), not at the next poll")
    func rpLogoutWakesLane() throws {
        // The lanes look for work once a minute on their own: only a wake-up delivers within seconds.
        let harness = try ProviderHarness(
            extra: ["OIDC_SESSION_SECONDS": "3600", "BROKER_DISPATCH_INTERVAL_MS": "60000"], roles: "api,dispatch")
        let receiver = try LogoutReceiver()
        let client = try harness.confidentialClient(extra: ["backchannel_logout_uri": receiver.url])
        let browser = SessionBrowser(harness)
        let signedIn = try signIn(harness, browser, client)
        let sent = Date()
        #expect(try logout(browser, [("id_token_hint", signedIn.idToken)]).status == 200)
        #expect(receiver.wait(for: 1, seconds: 20).count == 1)
        #expect(Date().timeIntervalSince(sent) < 20, "woken, not polled")
    }

    @Test(
        "with an id_token_hint: the session and all its grants end, each RP gets its logout token, and the browser goes to the registered post_logout_redirect_uri with state"
    )
    func logoutWithHint() throws {
        let harness = try Self.harness()
        let first = try LogoutReceiver()
        let second = try LogoutReceiver()
        let one = try harness.confidentialClient(
            extra: [
                "backchannel_logout_uri": first.url, "backchannel_logout_session_required": true,
                "post_logout_redirect_uris": [Self.bye],
            ])
        let two = try harness.confidentialClient(
            redirectURI: "https://other.example.com/cb", extra: ["backchannel_logout_uri": second.url])
        #expect(
            try harness.send("GET", "/oidc/.well-known/openid-configuration").json["end_session_endpoint"] as? String
                == ProviderHarness.issuer + "/logout")
        let browser = SessionBrowser(harness)
        let atOne = try signIn(harness, browser, one)
        let atTwo = try signIn(harness, browser, two)
        #expect(atTwo.claims["sid"] == atOne.claims["sid"], "one session")
        let cookie = try #require(browser.session)

        let answer = try logout(
            browser, [("id_token_hint", atOne.idToken), ("post_logout_redirect_uri", Self.bye), ("state", "bye-1")])
        #expect(answer.status == 302, "\(answer.bodyText)")
        #expect(answer.header("location") == Self.bye + "?state=bye-1", "state echoed, nothing else added")
        #expect(browser.session == nil, "the cookie is cleared")
        // Ended on the server: the old cookie opens nothing.
        browser.session = cookie
        #expect(try promptNone(browser, one) == "login_required")
        for signedIn in [atOne, atTwo] {
            #expect(
                try harness.send("GET", "/oidc/userinfo", headers: [("Authorization", "Bearer \(signedIn.access)")]).status == 401
            )
        }
        let refreshed = try harness.token([("grant_type", "refresh_token"), ("refresh_token", atTwo.refresh)], as: two)
        #expect(refreshed.json["error"] as? String == "invalid_grant")
        // Back-Channel Logout for both relying parties of the session, the initiator included.
        let toOne = try harness.verifiedClaims(try #require(first.wait(for: 1).first))
        #expect(toOne["sid"] == atOne.claims["sid"])
        #expect(toOne["sub"] == atOne.claims["sub"])
        #expect(toOne["aud"]?.stringValue == one.id)
        let toTwo = try harness.verifiedClaims(try #require(second.wait(for: 1).first))
        #expect(toTwo["sid"] == nil, "that RP did not ask for sessions")
        #expect(try harness.count("SELECT count(*) FROM oidc_logout_deliveries WHERE reason = 'rp_logout'") == 2)
        // A second logout with the same hint: nothing left to end, still back to the RP.
        let again = try logout(browser, [("id_token_hint", atOne.idToken), ("post_logout_redirect_uri", Self.bye)])
        #expect(again.status == 302 && again.header("location") == Self.bye)
    }

    @Test(
        "refused with a page, the session kept: unregistered or altered post_logout_redirect_uri, a forged or alg:none hint, another client's client_id"
    )
    func refusals() throws {
        let harness = try Self.harness()
        let client = try harness.confidentialClient(extra: ["post_logout_redirect_uris": [Self.bye]])
        let other = try harness.confidentialClient(redirectURI: "https://other.example.com/cb")
        let browser = SessionBrowser(harness)
        let signedIn = try signIn(harness, browser, client)
        let parts = signedIn.idToken.split(separator: ".").map(String.init)
        let none = Base64URL.encode(Array(#"{"alg":"none"}"#.utf8)) + "." + parts[1] + "."
        let foreign = try JWSSigner(key: try AsymmetricKey.generateRSA(), keyID: "k")
            .sign(claims: try harness.verifiedClaims(signedIn.idToken))
        for (parameters, why) in [
            ([("id_token_hint", signedIn.idToken), ("post_logout_redirect_uri", "https://evil.example.com/")], "unregistered"),
            ([("id_token_hint", signedIn.idToken), ("post_logout_redirect_uri", Self.bye + "?foo=bar")], "query added"),
            ([("id_token_hint", none), ("post_logout_redirect_uri", Self.bye)], "alg none"),
            ([("id_token_hint", foreign), ("post_logout_redirect_uri", Self.bye)], "signed by another key"),
            ([("id_token_hint", signedIn.idToken), ("client_id", other.id)], "another client"),
        ] {
            let answer = try logout(browser, parameters)
            #expect(answer.status == 400, "\(why): \(answer.status)")
            #expect(answer.header("location") == nil, "\(why): never a redirect")
            #expect(answer.header("content-type")?.hasPrefix("text/html") == true)
        }
        #expect(try promptNone(browser, client) == "code", "nothing was ended")
    }

    @Test("without an id_token_hint the person confirms; the form is bound to the session; then signed out, never redirected")
    func confirmation() throws {
        let harness = try Self.harness()
        let receiver = try LogoutReceiver()
        let client = try harness.confidentialClient(
            extra: ["post_logout_redirect_uris": [Self.bye], "backchannel_logout_uri": receiver.url])
        let browser = SessionBrowser(harness)
        _ = try signIn(harness, browser, client)
        let ask = try logout(browser, [("post_logout_redirect_uri", Self.bye), ("client_id", client.id), ("state", "x")])
        #expect(ask.status == 200, "\(ask.bodyText)")
        #expect(ask.header("location") == nil)
        #expect(ask.header("content-security-policy")?.contains("form-action 'self'") == true)
        let token = try #require(ask.bodyText.firstMatch(of: /name="token" value="([^"]+)"/)).1
        // A cross-site form without the page's token ends nothing.
        let forged = try browser.post("/oidc/logout/confirm", form: [("token", "x")])
        #expect(forged.status == 400)
        #expect(try promptNone(browser, client) == "code")
        let done = try browser.post("/oidc/logout/confirm", form: [("token", String(token))])
        #expect(done.status == 200, "\(done.bodyText)")
        #expect(done.header("location") == nil, "no post-logout redirection without a hint (RP-Initiated Logout §3)")
        #expect(done.bodyText.contains("signed out"))
        #expect(browser.session == nil)
        #expect(try promptNone(browser, client) == "login_required")
        #expect(receiver.wait(for: 1).count == 1, "its relying parties are logged out too")
        // No session, no parameters: just the page.
        let nobody = SessionBrowser(harness)
        let page = try logout(nobody, [])
        #expect(page.status == 200 && page.bodyText.contains("signed out"))
    }

    @Test("Back-Channel Logout 1.0 §2.8: a 400 from the relying party is final, recorded and not retried")
    func rejectedIsFinal() throws {
        let harness = try Self.harness()
        let receiver = try LogoutReceiver()
        receiver.answer(400)
        let client = try harness.confidentialClient(extra: ["backchannel_logout_uri": receiver.url])
        let browser = SessionBrowser(harness)
        let signedIn = try signIn(harness, browser, client)
        #expect(try logout(browser, [("id_token_hint", signedIn.idToken)]).status == 200)
        let deadline = Date().addingTimeInterval(15)
        while try harness.count("SELECT count(*) FROM oidc_logout_deliveries WHERE state = 'failed'") == 0 && Date() < deadline {
            Thread.sleep(forTimeInterval: 0.05)
        }
        // Retries would come every 50-100 ms: wait for several of them.
        Thread.sleep(forTimeInterval: 0.5)
        let row = try harness.pool.query(
            "SELECT state, attempts, last_status, last_error FROM oidc_logout_deliveries"
        ).single()
        #expect(try row.decode(String.self, "state") == "failed")
        #expect(try row.decode(Int.self, "attempts") == 1)
        #expect(try row.decode(Int?.self, "last_status") == 400)
        #expect(try row.decode(String?.self, "last_error") == "rejected")
        #expect(receiver.attempts == 1)
    }

    @Test("a grant without codes or tokens is kept for its logout while its session could live, then pruned")
    func keptForLogout() throws {
        let harness = try Self.harness()
        let receiver = try LogoutReceiver()
        let client = try harness.confidentialClient(
            extra: ["backchannel_logout_uri": receiver.url, "backchannel_logout_session_required": true])
        let browser = SessionBrowser(harness)
        let signedIn = try signIn(harness, browser, client)
        // Two days on (what used to prune it), its code and tokens gone, its session still able to live.
        try harness.pool.query("DELETE FROM oidc_tokens")
        try harness.pool.query("DELETE FROM oidc_codes")
        try harness.pool.query("UPDATE oidc_grants SET created_at = now() - interval '2 days'")
        let housekeeping = ProviderHousekeeping(pool: harness.pool, retention: .seconds(60), deadLetterRetention: .seconds(60))
        _ = try housekeeping.prune()
        #expect(try harness.count("SELECT count(*) FROM oidc_grants") == 1)
        // The relying party's session still gets its logout.
        #expect(try logout(browser, [("id_token_hint", signedIn.idToken)]).status == 200)
        let token = try harness.verifiedClaims(try #require(receiver.wait(for: 1).first))
        #expect(token["sid"] == signedIn.claims["sid"])
        // Once the session could no longer live, the grant goes.
        try harness.pool.query(
            "UPDATE oidc_grants SET ended_at = NULL, logout_until = now() - interval '1 second'")
        _ = try housekeeping.prune()
        #expect(try harness.count("SELECT count(*) FROM oidc_grants") == 0)
    }
}
