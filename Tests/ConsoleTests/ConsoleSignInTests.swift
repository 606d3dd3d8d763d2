import Console
import Foundation
import HTTPClient
import Locking
import PostgresClient
import StrictJSON
import Synchronization
import TestSupport
import Testing

/// Operators signing in through an OpenID Connect provider (a fake one on loopback):
/// code flow with PKCE, state and nonce, exact iss and aud, the 200 page that moves on, and
/// the step-up whose `auth_time` must be recent.
@Suite("Console OIDC sign-in", .offPool)
struct ConsoleSignInTests {
    private func broker(_ idp: FakeIdentityProvider) throws -> ConsoleBroker {
        try ConsoleBroker(
            oidc: ConsoleConfiguration.OIDC(
                issuer: idp.issuer, clientID: idp.clientID, clientSecret: idp.clientSecret,
                roleMap: ["dpo": [.compliance], "ops": [.operator]]))
    }

    /// Follows a sign-in from the console to the provider and back; returns the callback's answer.
    private func signIn(
        _ broker: ConsoleBroker, _ idp: FakeIdentityProvider, start: String = "/login/oidc", cookie: String? = nil,
        cookieAtCallback: Bool = false
    )
        throws -> HTTPClientResponse
    {
        let started = try broker.get(start, cookie: cookie)
        #expect(started.status == 303, "\(started.bodyText)")
        let authorize = try #require(started.header("Location"))
        #expect(authorize.hasPrefix(idp.issuer + "/authorize?"))
        let answered = try broker.client.send(.init(url: authorize))
        #expect(answered.status == 302)
        let callback = try #require(answered.header("Location"))
        let path = try #require(callback.range(of: "/callback?")).lowerBound
        // Chromium sends the Strict session cookie on the callback after the provider's redirect.
        return try broker.get(String(callback[path...]), cookie: cookieAtCallback ? cookie : nil)
    }

    @Test("code flow: PKCE S256, state, nonce; the callback answers 200 with a page that moves on and the session cookie")
    func signInFlow() throws {
        let idp = try FakeIdentityProvider()
        let broker = try broker(idp)
        #expect(try broker.get("/login").bodyText.contains("href=\"/login/oidc\""))
        let response = try signIn(broker, idp)
        #expect(response.status == 200)
        #expect(response.bodyText.contains("<meta http-equiv=\"refresh\" content=\"0;url=/\">"))
        #expect(response.bodyText.contains("<a href=\"/\">Continue</a>"))
        let cookie = try #require(ConsoleBroker.sessionCookie(response))
        let query = try #require(idp.authorizations.withLock { $0.last })
        #expect(query["response_type"] == "code" && query["code_challenge_method"] == "S256")
        #expect(query["client_id"] == idp.clientID && query["max_age"] == nil)
        #expect(query["state"]?.isEmpty == false && query["nonce"]?.isEmpty == false)
        let overview = try broker.get("/", cookie: cookie)
        #expect(overview.status == 200 && overview.bodyText.contains("Olive Operator (compliance)"))
        // The state was used up: the same callback again is refused.
        let again = try broker.get("/callback?code=x&state=\(FormEncodingForTests.escape(query["state"]!))")
        #expect(again.status == 403)
        #expect(
            try broker.count("SELECT count(*) FROM audit_log WHERE action = 'console.signed_in' AND actor = 'console:op-1'") == 1)
    }

    @Test("an ID token with another issuer, audience or nonce, expired, or without a mapped group is refused")
    func refusedTokens() throws {
        let idp = try FakeIdentityProvider()
        let broker = try broker(idp)
        let cases: [(String, (inout FakeIdentityProvider.Claims) -> Void)] = [
            ("iss", { $0.issuer = "http://127.0.0.1:1" }),
            ("aud", { $0.audience = .string("another-client") }),
            ("aud array without azp", { $0.audience = .array([.string("console-client"), .string("other")]) }),
            ("nonce", { $0.nonce = "not-the-nonce" }),
            ("expired", { $0.expiresIn = -120 }),
            ("no group", { $0.groups = ["marketing"] }),
        ]
        for (what, change) in cases {
            idp.next.withLock {
                $0 = FakeIdentityProvider.Claims()
                change(&$0)
            }
            let response = try signIn(broker, idp)
            #expect(response.status == 403, "\(what)")
            #expect(response.header("X-Console-Refusal") == "console_oidc_refused", "\(what)")
            #expect(ConsoleBroker.sessionCookie(response) == nil, "\(what)")
        }
        #expect(try broker.count("SELECT count(*) FROM console_sessions") == 0)
    }

    @Test(
        "step-up re-runs the sign-in with max_age=300: an old auth_time is refused, a fresh one renews the session with a new id")
    func stepUp() throws {
        let idp = try FakeIdentityProvider()
        let broker = try broker(idp)
        let first = try #require(ConsoleBroker.sessionCookie(try signIn(broker, idp)))
        try broker.pool.query("UPDATE console_sessions SET auth_time = now() - interval '10 minutes'")
        let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/deletions/new", cookie: first)))
        let create = try broker.post("/deletions/create", form: [("csrf_token", csrf)], cookie: first)
        #expect(create.status == 200 && create.bodyText.contains("content=\"0;url=/step-up?next=/deletions/new\""))

        // The provider ignores prompt=login and returns an old auth_time: refused.
        idp.next.withLock { $0.authTimeAgo = 600 }
        let stale = try signIn(broker, idp, start: "/step-up?next=/deletions/new", cookie: first)
        #expect(stale.status == 403)
        let query = try #require(idp.authorizations.withLock { $0.last })
        #expect(query["max_age"] == "300" && query["prompt"] == "login")
        // No auth_time at all: refused too.
        idp.next.withLock { $0.authTimeAgo = nil }
        #expect(try signIn(broker, idp, start: "/step-up?next=/deletions/new", cookie: first).status == 403)

        idp.next.withLock { $0.authTimeAgo = 5 }
        let fresh = try signIn(broker, idp, start: "/step-up?next=/deletions/new", cookie: first, cookieAtCallback: true)
        #expect(fresh.status == 200)
        #expect(fresh.bodyText.contains("content=\"0;url=/deletions/new\""))
        let second = try #require(ConsoleBroker.sessionCookie(fresh))
        #expect(second != first)
        #expect(try broker.get("/", cookie: first).status == 303, "the old session ended")
        let csrf2 = try #require(ConsoleBroker.csrfToken(try broker.get("/deletions/new", cookie: second)))
        let retried = try broker.post("/deletions/create", form: [("csrf_token", csrf2)], cookie: second)
        #expect(retried.status == 400, "past the step-up, the form itself is checked")
        // A step-up for another operator's session is refused.
        idp.next.withLock { $0.sub = "someone-else" }
        #expect(try signIn(broker, idp, start: "/step-up", cookie: second).status == 403)
    }

    @Test("sign-ins started from one address are budgeted (each stores a transaction); expired transactions are dropped")
    func startBudget() throws {
        let idp = try FakeIdentityProvider()
        let broker = try broker(idp)
        // A burst of 30, then one a second: the budget refills while the loop runs, by as many
        // seconds as a loaded machine takes, so the count allows for that refill.
        let started = ContinuousClock.now
        var started303 = 0
        var refused = false
        for _ in 0..<200 {
            let status = try broker.get("/login/oidc").status
            if status == 429 {
                refused = true
                break
            }
            #expect(status == 303)
            started303 += 1
        }
        let refill = Int((ContinuousClock.now - started).components.seconds) + 1
        #expect(refused && started303 >= 30 && started303 <= 30 + refill, "\(started303) started in \(refill) s")
        #expect(try broker.count("SELECT count(*) FROM console_oidc_transactions") == started303, "one row per start")
        try broker.pool.query("UPDATE console_oidc_transactions SET expires_at = now() - interval '1 second'")
        let cookie = try broker.signIn(.viewer)
        #expect(try broker.get("/step-up", cookie: cookie).status == 303)
        #expect(try broker.count("SELECT count(*) FROM console_oidc_transactions") == 1)
    }

    @Test("a sign-in whose ID token has no auth_time is not a recent proof: the first step-up route asks for a step-up")
    func signInWithoutAuthTime() throws {
        let idp = try FakeIdentityProvider()
        let broker = try broker(idp)
        idp.next.withLock { $0.authTimeAgo = nil }
        let cookie = try #require(ConsoleBroker.sessionCookie(try signIn(broker, idp)))
        let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/deletions/new", cookie: cookie)))
        let create = try broker.post("/deletions/create", form: [("csrf_token", csrf)], cookie: cookie)
        #expect(create.status == 200 && create.bodyText.contains("content=\"0;url=/step-up?next=/deletions/new\""))
    }

    @Test("sign-ins under way are bounded for all addresses together: past the limit, 503 and no row")
    func transactionLimit() throws {
        let idp = try FakeIdentityProvider()
        let broker = try ConsoleBroker(
            oidc: ConsoleConfiguration.OIDC(
                issuer: idp.issuer, clientID: idp.clientID, clientSecret: idp.clientSecret, roleMap: ["dpo": [.compliance]]),
            configure: { $0.oidcTransactionLimit = 3 })
        let statuses = try (0..<5).map { _ in try broker.get("/login/oidc").status }
        #expect(statuses == [303, 303, 303, 503, 503])
        #expect(try broker.count("SELECT count(*) FROM console_oidc_transactions") == 3)
        // A step-up is a sign-in under way too.
        let cookie = try broker.signIn(.viewer)
        #expect(try broker.get("/step-up", cookie: cookie).status == 503)
        // Expired transactions make room again.
        try broker.pool.query("UPDATE console_oidc_transactions SET expires_at = now() - interval '1 second'")
        #expect(try broker.get("/login/oidc").status == 303)
        #expect(try broker.count("SELECT count(*) FROM console_oidc_transactions") == 1)
    }

    @Test("next= only ever returns to a path of the console")
    func safeReturn() throws {
        let idp = try FakeIdentityProvider()
        let broker = try broker(idp)
        for next in ["//evil.example/x", "https://evil.example/", "/\\evil", "/ok?x=1"] {
            let response = try signIn(broker, idp, start: "/login/oidc?next=\(FormEncodingForTests.escape(next))")
            let expected = next == "/ok?x=1" ? next : "/"
            #expect(
                response.bodyText.contains("content=\"0;url=\(expected.replacingOccurrences(of: "&", with: "&amp;"))\""),
                "\(next)")
        }
    }
}
