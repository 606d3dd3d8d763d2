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

    /// Follows a sign-in from the console to the provider and back in one browser (its OIDC
    /// binding cookie goes with the callback); returns the callback's answer.
    private func signIn(
        _ broker: ConsoleBroker, _ idp: FakeIdentityProvider, start: String = "/login/oidc", cookie: String? = nil,
        cookieAtCallback: Bool = false
    )
        throws -> HTTPClientResponse
    {
        let (path, binding) = try callbackOf(broker, idp, start: start, cookie: cookie)
        // Chromium sends the Strict session cookie on the callback after the provider's redirect.
        return try broker.get(path, cookie: cookieAtCallback ? cookie : nil, cookies: binding.isEmpty ? [] : [binding])
    }

    /// Starts a sign-in and lets the provider answer: the callback's path and the binding
    /// cookie (`name=value`) the start set in the browser that started it.
    private func callbackOf(
        _ broker: ConsoleBroker, _ idp: FakeIdentityProvider, start: String = "/login/oidc", cookie: String? = nil
    )
        throws -> (path: String, binding: String)
    {
        let started = try broker.get(start, cookie: cookie)
        #expect(started.status == 303, "\(started.bodyText)")
        let binding = ConsoleBroker.setCookie("__Host-console-oidc", started) ?? ""
        #expect(!binding.isEmpty, "the start binds the sign-in to this browser")
        let authorize = try #require(started.header("Location"))
        #expect(authorize.hasPrefix(idp.issuer + "/authorize?"))
        let answered = try broker.client.send(.init(url: authorize))
        #expect(answered.status == 302)
        let callback = try #require(answered.header("Location"))
        let path = try #require(callback.range(of: "/callback?")).lowerBound
        return (String(callback[path...]), binding)
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

    @Test(
        "a sign-in is bound to the browser that started it: its callback elsewhere signs no one in, uses nothing up, and is audited"
    )
    func callbackBoundToBrowser() throws {
        let idp = try FakeIdentityProvider()
        let broker = try broker(idp)
        // The attacker starts a sign-in as themself and hands the callback URL to a victim.
        idp.next.withLock { $0.sub = "mallory" }
        let (path, binding) = try callbackOf(broker, idp)
        // The victim's browser: no binding cookie, or the one of a sign-in of its own.
        let (_, victims) = try callbackOf(broker, idp)
        for cookies in [[], victims.isEmpty ? [] : [victims]] {
            let opened = try broker.get(path, cookies: cookies)
            #expect(opened.status == 403, "\(cookies)")
            #expect(opened.header("X-Console-Refusal") == "console_oidc_refused")
            #expect(ConsoleBroker.sessionCookie(opened) == nil)
            #expect(opened.headers.contains { $0.0.lowercased() == "set-cookie" && $0.1.hasPrefix("__Host-console-oidc=;") })
        }
        #expect(try broker.count("SELECT count(*) FROM console_sessions") == 0)
        #expect(
            try broker.count(
                "SELECT count(*) FROM audit_log WHERE action = 'console.sign_in_refused' AND outcome = 'refused' AND target = 'console_session'"
            ) == 2)
        let reasons = try broker.pool.query(
            "SELECT detail->>'reason' FROM audit_log WHERE action = 'console.sign_in_refused' ORDER BY id"
        ).map { try $0.decode(String.self, 0) }
        #expect(reasons == ["browser_not_bound", "browser_mismatch"])
        // The state was not used up: the browser that started the sign-in still finishes it.
        let own = try broker.get(path, cookies: binding.isEmpty ? [] : [binding])
        #expect(own.status == 200 && ConsoleBroker.sessionCookie(own) != nil)
        // The binding cookie: this host only, HTTPS only, out of script's reach, sent on the
        // provider's top-level redirect back, gone with the transaction.
        let setCookie = try #require(
            try broker.get("/login/oidc").headers.first { $0.0.lowercased() == "set-cookie" }?.1)
        #expect(setCookie.hasPrefix("__Host-console-oidc="))
        for attribute in ["Path=/", "Secure", "HttpOnly", "SameSite=Lax", "Max-Age=600"] {
            #expect(setCookie.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces) }.contains(attribute))
        }
    }

    @Test(
        "an operator's roles are their groups' under the role map, read on every request; a sign-in with fewer groups, or none mapped, reaches every session"
    )
    func rolesFollowTheMapping() throws {
        let idp = try FakeIdentityProvider()
        let broker = try broker(idp)
        idp.next.withLock { $0.groups = ["dpo"] }
        let laptop = try #require(ConsoleBroker.sessionCookie(try signIn(broker, idp)))
        #expect(try broker.get("/deletions/new", cookie: laptop).status == 200)
        // The session's roles come from its groups at each request, not from what was stored.
        try broker.pool.query("UPDATE console_sessions SET groups = '{ops}'")
        #expect(try broker.get("/deletions/new", cookie: laptop).status == 403)
        try broker.pool.query("UPDATE console_sessions SET groups = '{dpo}'")
        #expect(try broker.get("/deletions/new", cookie: laptop).status == 200)
        // The provider moved the operator from dpo to ops: a sign-in elsewhere moves the laptop too.
        idp.next.withLock { $0.groups = ["ops"] }
        let phone = try #require(ConsoleBroker.sessionCookie(try signIn(broker, idp)))
        #expect(try broker.get("/deletions/new", cookie: laptop).status == 403)
        #expect(try broker.get("/api-keys", cookie: laptop).status == 200, "an operator's page")
        #expect(try broker.get("/deletions/new", cookie: phone).status == 403)
        // Removed from every mapped group: the sign-in is refused and both sessions end.
        idp.next.withLock { $0.groups = ["marketing"] }
        #expect(try signIn(broker, idp).status == 403)
        for cookie in [laptop, phone] {
            let answer = try broker.get("/", cookie: cookie)
            #expect(answer.status == 303 && answer.header("Location") == "/login")
        }
        #expect(try broker.count("SELECT count(*) FROM console_sessions WHERE ended_at IS NULL") == 0)
        #expect(
            try broker.count(
                "SELECT count(*) FROM audit_log WHERE action = 'console.sign_in_refused' AND actor = 'console:op-1' AND detail->>'reason' = 'no_mapped_group'"
            ) == 1)
        // A session whose groups map to nothing under this process's map ends at its next request.
        idp.next.withLock { $0.groups = ["dpo"] }
        let again = try #require(ConsoleBroker.sessionCookie(try signIn(broker, idp)))
        try broker.pool.query("UPDATE console_sessions SET groups = '{marketing}' WHERE ended_at IS NULL")
        #expect(try broker.get("/", cookie: again).status == 303)
        #expect(try broker.count("SELECT count(*) FROM console_sessions WHERE ended_at IS NULL") == 0)
    }

    @Test("failed sign-ins are audited without secrets, at most a bounded number of rows for all addresses together")
    func failedSignInsBounded() throws {
        let idp = try FakeIdentityProvider()
        let broker = try ConsoleBroker(
            oidc: ConsoleConfiguration.OIDC(
                issuer: idp.issuer, clientID: idp.clientID, clientSecret: idp.clientSecret, roleMap: ["dpo": [.compliance]]),
            configure: {
                $0.failedSignInAuditBurst = 5
                $0.failedSignInAuditsPerSecond = 0.5
            })
        // 40 refused callbacks (no binding cookie): a burst of 5 rows, then one every 2 s.
        let started = ContinuousClock.now
        for index in 0..<40 { _ = try broker.get("/callback?code=code\(index)x&state=state\(index)x") }
        let refill = Int((ContinuousClock.now - started).components.seconds / 2) + 1
        let rows = try broker.count("SELECT count(*) FROM audit_log WHERE action = 'console.sign_in_refused'")
        #expect(rows >= 5 && rows <= 5 + refill, "\(rows) rows in \(refill * 2) s")
        let details = try broker.pool.query("SELECT detail::text FROM audit_log WHERE action = 'console.sign_in_refused'")
            .map { try $0.decode(String.self, 0) }
        #expect(details.allSatisfy { !$0.contains("code1") && !$0.contains("state1") && !$0.contains("127.0.0.1") })
        // A failed link redemption is one too; once the budget allows a row, it says how many were left out.
        var last: (method: String, suppressed: Int)?
        try waitUntil(seconds: 10) {
            _ = try broker.post("/link", form: [("token", "guess")])
            let row = try broker.pool.query(
                """
                SELECT detail->>'method' AS method, COALESCE((detail->>'suppressed')::int, 0) AS suppressed FROM audit_log
                WHERE action = 'console.sign_in_refused' AND detail->>'method' = 'link' ORDER BY id DESC LIMIT 1
                """
            ).first
            last = try row.map { (try $0.decode(String.self, "method"), try $0.decode(Int.self, "suppressed")) }
            return last != nil
        }
        #expect(last?.method == "link")
        #expect((last?.suppressed ?? 0) >= 40 - rows)
    }
}
