import BrokerCore
import Console
import Foundation
import HTTPClient
import HTTPServer
import Observability
import PostgresClient
import TestSupport
import Testing

/// The console's doors: its own listener and headers, sign-in links, sessions, CSRF, and
/// the role × route × method matrix read from the same route table the router is built from.
@Suite("Console access", .offPool)
struct ConsoleAccessTests {
    static let csp =
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

    private func expectConsoleHeaders(_ response: HTTPClientResponse, _ what: String) {
        #expect(response.header("Content-Security-Policy") == Self.csp, "\(what)")
        #expect(response.header("X-Content-Type-Options") == "nosniff", "\(what)")
        #expect(response.header("Referrer-Policy") == "no-referrer", "\(what)")
        #expect(response.header("Cross-Origin-Opener-Policy") == "same-origin", "\(what)")
        #expect(response.header("Cache-Control") == "no-store", "\(what)")
    }

    @Test("every role × route × method of the route table: allowed is never 403, refused is always 403")
    func roleMatrix() throws {
        let broker = try ConsoleBroker()
        let unknown = UUID().uuidString.lowercased()
        for role in ConsoleRole.allCases {
            let cookie = try broker.signIn(role)
            let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/", cookie: cookie)))
            for route in ConsoleRoute.table where route.roles != nil && route.page != .signOut {
                let path = route.pattern.replacingOccurrences(of: "{id}", with: unknown)
                let response =
                    route.method == .get
                    ? try broker.get(path, cookie: cookie)
                    : try broker.post(path, form: [("csrf_token", csrf)], cookie: cookie)
                let what = "\(role) \(route.method) \(route.pattern): \(response.status)"
                if route.roles!.contains(role) {
                    #expect(response.status != 403 && response.status < 500, "\(what)")
                } else {
                    #expect(response.status == 403, "\(what)")
                    #expect(response.header("X-Console-Refusal") == "console_forbidden", "\(what)")
                    #expect(!response.bodyText.contains(unknown) || route.method == .get, "\(what)")
                }
                expectConsoleHeaders(response, what)
            }
        }
    }

    @Test("signed out, every page but the sign-in pages sends GET to /login and refuses POST with 403")
    func signedOut() throws {
        let broker = try ConsoleBroker()
        for route in ConsoleRoute.table where route.roles != nil {
            let path = route.pattern.replacingOccurrences(of: "{id}", with: UUID().uuidString.lowercased())
            let response = route.method == .get ? try broker.get(path) : try broker.post(path, form: [])
            if route.method == .get {
                #expect(response.status == 303 && response.header("Location") == "/login", "\(route.pattern)")
            } else {
                #expect(response.status == 403, "\(route.pattern)")
            }
        }
        for path in ["/login", "/console.css", "/link?token=x"] {
            let response = try broker.get(path)
            #expect(response.status == 200, "\(path)")
            expectConsoleHeaders(response, path)
        }
        // The server's own answers (unknown path, wrong method) are pages too, not problem+json.
        let missing = try broker.get("/no-such-page")
        expectConsoleHeaders(missing, "404")
        #expect(missing.status == 404 && missing.header("Content-Type") == "text/html; charset=utf-8")
        #expect(missing.bodyText.contains("<html lang=\"en\">") && missing.bodyText.contains("<title>Not found"))
        let wrongMethod = try broker.post("/console.css", form: [])
        #expect(wrongMethod.status == 405 && wrongMethod.header("Content-Type") == "text/html; charset=utf-8")
    }

    @Test("the console is served on its own listener only: the API's has none of its routes or headers")
    func ownListener() throws {
        let broker = try ConsoleBroker()
        for path in ["/", "/login", "/deletions", "/console.css"] {
            let response = try broker.client.send(.init(url: broker.apiURL + path))
            #expect(response.status == 404, "\(path)")
            #expect(response.header("Content-Security-Policy") == nil, "\(path)")
        }
        #expect(try broker.get("/v1/deletions").status == 404)
    }

    @Test("a sign-in link signs in once: __Host- cookie, Secure, HttpOnly, SameSite=Strict; used or unknown is 403")
    func linkSignIn() throws {
        let broker = try ConsoleBroker()
        let token = try broker.link(.viewer, operator: "bob")
        // The landing page is a form: fetching the URL (a link preview) does not use it up.
        let landing = try broker.get("/link?token=\(token)")
        #expect(landing.status == 200)
        #expect(ConsoleBroker.hidden("token", landing) == token)
        let response = try broker.post("/link", form: [("token", token)])
        #expect(response.status == 303 && response.header("Location") == "/")
        let setCookie = try #require(response.headers.first { $0.0.lowercased() == "set-cookie" }?.1)
        #expect(setCookie.hasPrefix("__Host-console="))
        for attribute in ["Path=/", "Secure", "HttpOnly", "SameSite=Strict"] {
            #expect(setCookie.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces) }.contains(attribute))
        }
        let cookie = try #require(ConsoleBroker.sessionCookie(response))
        let overview = try broker.get("/", cookie: cookie)
        #expect(overview.status == 200)
        #expect(overview.bodyText.contains("bob (viewer)"))
        // Single use; an unknown token the same.
        #expect(try broker.post("/link", form: [("token", token)]).status == 403)
        #expect(try broker.post("/link", form: [("token", "nope")]).status == 403)
        // Stored hashed: the token is nowhere in the database's link table.
        #expect(
            try broker.count("SELECT count(*) FROM console_links WHERE encode(token_hash, 'escape') LIKE \("%" + token + "%")")
                == 0)
        #expect(
            try broker.count("SELECT count(*) FROM console_links WHERE token_hash = sha256(convert_to(\(token), 'UTF8'))") == 1)
        // Audited as console.*, with the operator as actor and no token.
        let actions = try broker.pool.query(
            "SELECT action, actor, detail::text AS detail FROM audit_log WHERE action LIKE 'console.%' ORDER BY id"
        )
        .map { (try $0.decode(String.self, "action"), try $0.decode(String.self, "actor"), try $0.decode(String.self, "detail")) }
        // The used and the unknown token are failed sign-ins, audited too (no actor to name).
        #expect(
            actions.map(\.0) == [
                "console.link_created", "console.link_redeemed", "console.sign_in_refused", "console.sign_in_refused",
            ])
        #expect(actions.map(\.1).dropFirst() == ["console:bob", "anonymous", "anonymous"])
        #expect(actions.allSatisfy { !$0.2.contains(token) })
    }

    @Test("an expired link is refused; redemptions are rate-limited per address")
    func linkLimits() throws {
        let broker = try ConsoleBroker()
        let token = try broker.link(.viewer)
        try broker.pool.query("UPDATE console_links SET expires_at = now() - interval '1 second'")
        #expect(try broker.post("/link", form: [("token", token)]).status == 403)
        var statuses: [Int] = []
        for _ in 0..<12 { statuses.append(try broker.post("/link", form: [("token", "guess")]).status) }
        #expect(statuses.prefix(9).allSatisfy { $0 == 403 })
        #expect(statuses.last == 429)
        // Only wrong tokens spend the budget: valid links, more than a burst of them, all sign in,
        // and guessing stays limited after them.
        let busy = try ConsoleBroker()
        var signIns: [Int] = []
        for _ in 0..<14 { signIns.append(try busy.post("/link", form: [("token", try busy.link(.viewer))]).status) }
        #expect(signIns.allSatisfy { $0 == 303 }, "\(signIns)")
        var guesses: [Int] = []
        for _ in 0..<12 { guesses.append(try busy.post("/link", form: [("token", "guess")]).status) }
        #expect(guesses.last == 429, "\(guesses)")
    }

    @Test("sign-out ends the session on the server; signing in again gives a new session id and ends the old one")
    func sessions() throws {
        let broker = try ConsoleBroker()
        let first = try broker.signIn(.operator)
        let page = try broker.get("/", cookie: first)
        let csrf = try #require(ConsoleBroker.csrfToken(page))
        // Signing in again from the same browser: a new id; the old one is over.
        let again = try broker.post("/link", form: [("token", try broker.link(.operator))], cookie: first)
        let second = try #require(ConsoleBroker.sessionCookie(again))
        #expect(second != first)
        #expect(try broker.get("/", cookie: first).status == 303)
        #expect(try broker.get("/", cookie: second).status == 200)
        // Sign-out needs the session's own form token.
        #expect(try broker.post("/logout", form: [("csrf_token", csrf)], cookie: second).status == 403)
        let csrf2 = try #require(ConsoleBroker.csrfToken(try broker.get("/", cookie: second)))
        let out = try broker.post("/logout", form: [("csrf_token", csrf2)], cookie: second)
        #expect(out.status == 303 && out.header("Location") == "/login")
        #expect(out.headers.contains { $0.0.lowercased() == "set-cookie" && $0.1.contains("Max-Age=0") })
        // The old cookie, replayed, signs nobody in.
        let replay = try broker.get("/", cookie: second)
        #expect(replay.status == 303 && replay.header("Location") == "/login")
        #expect(try broker.count("SELECT count(*) FROM console_sessions WHERE ended_at IS NULL") == 0)
        // Only hashes are stored.
        #expect(
            try broker.count("SELECT count(*) FROM console_sessions WHERE id_hash = sha256(convert_to(\(second), 'UTF8'))") == 1)
    }

    @Test("a POST without the session's CSRF token, with another session's, or marked cross-site is 403")
    func csrf() throws {
        let broker = try ConsoleBroker()
        let alice = try broker.signIn(.operator, operator: "alice")
        let mallory = try broker.signIn(.operator, operator: "mallory")
        let aliceToken = try #require(ConsoleBroker.csrfToken(try broker.get("/", cookie: alice)))
        let malloryToken = try #require(ConsoleBroker.csrfToken(try broker.get("/", cookie: mallory)))
        #expect(aliceToken != malloryToken)
        for form in [[], [("csrf_token", malloryToken)], [("csrf_token", "")]] {
            let response = try broker.post("/logout", form: form, cookie: alice)
            #expect(response.status == 403)
            #expect(response.header("X-Console-Refusal") == "console_csrf")
        }
        let crossSite = try broker.post(
            "/logout", form: [("csrf_token", aliceToken)], cookie: alice, headers: [("Sec-Fetch-Site", "cross-site")])
        #expect(crossSite.status == 403)
        #expect(try broker.get("/", cookie: alice).status == 200, "alice is still signed in")
    }

    @Test("a POST whose Origin is not the console's, or whose Fetch metadata is not same-origin, is 403: sign-in links too")
    func originChecked() throws {
        let broker = try ConsoleBroker(configure: { $0.publicURL = "https://console.example.com:443/" })
        for headers in [
            [("Origin", "https://evil.example")], [("Origin", "null"), ("Sec-Fetch-Site", "cross-site")],
            [("Origin", "https://console.example.com:8443")],
            [("Sec-Fetch-Site", "same-site")], [("Origin", "https://console.example.com"), ("Sec-Fetch-Site", "cross-site")],
        ] {
            let forged = try broker.post(
                "/link", form: [("token", try broker.link(.admin, operator: "mallory"))], headers: headers)
            #expect(forged.status == 403 && ConsoleBroker.sessionCookie(forged) == nil, "\(headers)")
        }
        let same = try broker.post(
            "/link", form: [("token", try broker.link(.admin, operator: "alice"))],
            headers: [("Origin", "https://console.example.com"), ("Sec-Fetch-Site", "same-origin")])
        #expect(same.status == 303 && ConsoleBroker.sessionCookie(same) != nil)
        // Under the console's Referrer-Policy: no-referrer, Chromium's own same-origin form sends `Origin: null`.
        let own = try broker.post(
            "/link", form: [("token", try broker.link(.admin, operator: "bob"))],
            headers: [("Origin", "null"), ("Sec-Fetch-Site", "same-origin")])
        #expect(own.status == 303 && ConsoleBroker.sessionCookie(own) != nil)
    }

    @Test("behind a trusted proxy each client has its own sign-in budget and is the access log's client (BROKER_TRUSTED_PROXIES)")
    func trustedProxies() throws {
        let broker = try ConsoleBroker(extra: ["BROKER_TRUSTED_PROXIES": "127.0.0.1/32"])
        var statuses: [Int] = []
        for _ in 0..<12 {
            statuses.append(
                try broker.post("/link", form: [("token", "guess")], headers: [("X-Forwarded-For", "198.51.100.7")]).status)
        }
        #expect(statuses.last == 429, "\(statuses)")
        // Another operator behind the same proxy is not locked out by the first one's attempts.
        let other = try broker.post(
            "/link", form: [("token", try broker.link(.viewer))], headers: [("X-Forwarded-For", "198.51.100.8")])
        #expect(other.status == 303)
        #expect(
            broker.logs.capturedLines.contains {
                $0.contains("\"msg\":\"request\"") && $0.contains("\"route\":\"/link\"")
                    && $0.contains("\"client\":\"198.51.100.8\"")
            })
        // From a peer that is not a trusted proxy the header names nobody.
        let direct = try ConsoleBroker()
        for _ in 0..<11 {
            _ = try direct.post("/link", form: [("token", "guess")], headers: [("X-Forwarded-For", "198.51.100.9")])
        }
        let spoofed = try direct.post(
            "/link", form: [("token", try direct.link(.viewer))], headers: [("X-Forwarded-For", "198.51.100.10")])
        #expect(spoofed.status == 429)
    }

    @Test("a step-up route with a sign-in older than five minutes moves the operator on to /step-up")
    func stepUp() throws {
        let broker = try ConsoleBroker()
        let cookie = try broker.signIn(.operator)
        let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/", cookie: cookie)))
        let id = UUID().uuidString.lowercased()
        try broker.pool.query("UPDATE console_sessions SET auth_time = now() - interval '6 minutes'")
        let response = try broker.post("/deletions/\(id)/retry", form: [("csrf_token", csrf)], cookie: cookie)
        // A page that moves on by GET, not a 303: a redirect chain from a form's POST to the identity
        // provider breaks `form-action 'self'` in Chromium.
        #expect(response.status == 200 && response.header("Location") == nil)
        #expect(response.bodyText.contains("content=\"0;url=/step-up?next=/deletions/\(id)/retry\""))
        #expect(try broker.get("/step-up", cookie: cookie).status == 200)
        try broker.pool.query("UPDATE console_sessions SET auth_time = now() - interval '4 minutes'")
        #expect(try broker.post("/deletions/\(id)/retry", form: [("csrf_token", csrf)], cookie: cookie).status == 404)
    }

    @Test("the HTML builder escapes every interpolated string, per Unicode scalar")
    func escaping() {
        let hostile = "<script>\"'&\u{0600}<"
        let html: HTML = "<p title=\"\(hostile)\">\(hostile)</p>"
        #expect(
            html.markup
                == "<p title=\"&lt;script&gt;&quot;&#39;&amp;\u{0600}&lt;\">&lt;script&gt;&quot;&#39;&amp;\u{0600}&lt;</p>")
    }
}
