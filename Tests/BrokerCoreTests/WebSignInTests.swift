import AppleSimulator
import BrokerAPI
import BrokerCrypto
import Foundation
import HTTPClient
import PostgresClient
import ProcessRunner
import TestSupport
import Testing

@testable import BrokerCore

/// Web sign-in end to end over HTTP: broker → simulator's `/auth/authorize` → the form Apple
/// posts back → broker callback → `return_to` → redeem.
@Suite("Web sign-in", .offPool)
struct WebSignInTests {
    static let returnTo = "https://app.example.com/apple/done"
    /// Behind a proxy the public URL differs from where the broker listens; tests post the
    /// simulator's form to the real address and check it named the public one.
    static let publicURL = "https://broker.example.com"

    static func broker() throws -> TestBroker {
        let broker = try TestBroker(extra: [
            "BROKER_PUBLIC_URL": publicURL,
            "APPLE_WEB_RETURN_URLS": "\(TestBroker.webClientID)=\(returnTo),https://app.example.com/other",
        ])
        // The broker's callback, registered as a Return URL of the Services ID (Apple refuses others).
        broker.simulator.registerReturnURLs(clientID: TestBroker.webClientID, urls: [publicURL + "/v1/apple/web/callback"])
        return broker
    }

    /// Where a redirect goes, split into its base and query parameters.
    struct Redirect {
        var base: String
        var query: [String: String]

        init(_ response: HTTPClientResponse) throws {
            let location = try #require(response.headers.first { $0.0.lowercased() == "location" }?.1, "no Location header")
            let parts = location.split(separator: "?", maxSplits: 1).map(String.init)
            base = parts[0]
            query = [:]
            for (name, value) in FormEncoding.decode(parts.count > 1 ? parts[1] : "") { query[name] = value }
        }
    }

    /// Apple's auto-submitting form: its action and hidden fields.
    struct ApplePage {
        var action: String
        var fields: [(String, String)]
        /// The `Cookie` header of the browser that started the sign-in.
        var cookie: [(String, String)] = []

        init(_ html: String) throws {
            func unescape(_ text: String) -> String {
                text.replacingOccurrences(of: "&quot;", with: "\"").replacingOccurrences(of: "&#39;", with: "'")
                    .replacingOccurrences(of: "&lt;", with: "<").replacingOccurrences(of: "&gt;", with: ">")
                    .replacingOccurrences(of: "&amp;", with: "&")
            }
            let action = try #require(html.firstMatch(of: /action="([^"]*)"/), "no form in: \(html)")
            self.action = unescape(String(action.1))
            fields = html.matches(of: /name="([^"]*)" value="([^"]*)"/).map { (unescape(String($0.1)), unescape(String($0.2))) }
        }

        subscript(name: String) -> String? { fields.first { $0.0 == name }?.1 }
    }

    /// Starts a sign-in and follows the broker's redirect to the simulator, which plays the
    /// user (`sim` parameters) and answers with the form Apple would post.
    func startSignIn(_ broker: TestBroker, sim: [(String, String)] = [], tamper: (inout [String: String]) -> Void = { _ in })
        throws -> ApplePage
    {
        let start = try broker.get(
            "/v1/apple/web/authorize?client_id=\(TestBroker.webClientID)&return_to=\(FormEncoding.escape(Self.returnTo))&app_state=s-42"
        )
        #expect(start.status == 302, "\(start.bodyText)")
        let setCookie = try #require(start.header("set-cookie"), "authorize sets the browser's binding")
        #expect(setCookie.hasPrefix("__Host-abk_signin=") && setCookie.contains("Secure") && setCookie.contains("HttpOnly"))
        #expect(setCookie.contains("Path=/") && setCookie.contains("SameSite=None") && !setCookie.contains("Domain"))
        var toApple = try Redirect(start)
        #expect(toApple.base == broker.simulator.baseURL + "/auth/authorize")
        #expect(toApple.query["response_type"] == "code id_token")
        #expect(toApple.query["response_mode"] == "form_post")
        #expect(toApple.query["scope"] == "name email")
        #expect(toApple.query["redirect_uri"] == Self.publicURL + "/v1/apple/web/callback")
        tamper(&toApple.query)
        let query = FormEncoding.encode(toApple.query.map { ($0.key, $0.value) } + sim)
        let page = try broker.client.send(.init(url: toApple.base + "?" + query))
        #expect(page.status == 200, "\(page.bodyText)")
        var form = try ApplePage(page.bodyText)
        #expect(form.action == Self.publicURL + "/v1/apple/web/callback")
        form.cookie = [("Cookie", String(setCookie.prefix { $0 != ";" }))]
        return form
    }

    /// Posts Apple's form to the broker's callback, as the browser would.
    func post(_ form: ApplePage, to broker: TestBroker) throws -> HTTPClientResponse {
        try broker.client.send(
            .init(
                method: "POST", url: broker.baseURL + "/v1/apple/web/callback",
                headers: [("Content-Type", "application/x-www-form-urlencoded")] + form.cookie,
                body: Array(FormEncoding.encode(form.fields).utf8)))
    }

    func redeem(_ code: String, _ broker: TestBroker) throws -> HTTPClientResponse {
        let body = String(decoding: try JSONSerialization.data(withJSONObject: ["result_code": code]), as: UTF8.self)
        return try broker.post("/v1/apple/web/redeem", json: body, key: broker.loginKey())
    }

    @Test("login CSRF: a state finishes only in the browser that started it (its __Host- cookie), and nothing is spent otherwise")
    func stateBoundToBrowser() throws {
        let broker = try Self.broker()
        // The attacker starts a sign-in of their own and has the victim's browser post it.
        var attackers = try startSignIn(broker)
        let attackerCookie = attackers.cookie
        attackers.cookie = []
        let noCookie = try post(attackers, to: broker)
        #expect(noCookie.status == 400 && noCookie.json["code"] as? String == "invalid_state", "\(noCookie.bodyText)")
        var victims = try startSignIn(broker)
        let victimCookie = victims.cookie
        attackers.cookie = victimCookie
        #expect(try post(attackers, to: broker).json["code"] as? String == "invalid_state", "another browser's binding")
        #expect(try broker.count("SELECT count(*) FROM web_used_states") == 0, "a refused state is not spent")
        // The right browser still finishes both.
        attackers.cookie = attackerCookie
        #expect(try post(attackers, to: broker).status == 303)
        victims.cookie = victimCookie
        let finished = try post(victims, to: broker)
        #expect(finished.status == 303)
        #expect(finished.header("set-cookie")?.contains("Max-Age=0") == true, "the binding is cleared once used")
    }

    @Test("a first sign-in ends at return_to with a result code the backend redeems once for the login answer")
    func success() throws {
        let broker = try Self.broker()
        let form = try startSignIn(broker, sim: [("sim_first_name", "Ada"), ("sim_last_name", "Lovelace")])
        #expect(form["user"]?.contains("Ada") == true, "Apple sends the name on the first authorization")
        let callback = try post(form, to: broker)
        #expect(callback.status == 303, "\(callback.bodyText)")
        let back = try Redirect(callback)
        #expect(back.base == Self.returnTo)
        #expect(back.query["app_state"] == "s-42")
        #expect(back.query["error"] == nil, "\(back.query)")
        let code = try #require(back.query["result_code"])

        let redeemed = try redeem(code, broker)
        #expect(redeemed.status == 200, "\(redeemed.bodyText)")
        let answer = redeemed.json
        #expect(answer["is_new_user"] as? Bool == true)
        #expect(answer["refresh_token_stored"] as? Bool == true, "the code was exchanged with the redirect_uri")
        #expect((answer["email"] as? String)?.hasSuffix("@privaterelay.appleid.com") == true)
        let userID = try #require(answer["user_id"] as? String)
        let user = try broker.get("/v1/users/\(userID)", key: broker.key([.read])).json
        let identity = try #require((user["identities"] as? [[String: Any]])?.first)
        #expect(identity["given_name"] as? String == "Ada")
        #expect(identity["family_name"] as? String == "Lovelace")
        #expect(identity["client_id"] as? String == TestBroker.webClientID)

        let again = try redeem(code, broker)
        #expect(again.status == 400)
        #expect(again.json["code"] as? String == "result_code_invalid")

        // Signing in again: no `user` this time, same user, not new.
        let sub = try #require(answer["apple_sub"] as? String)
        let second = try startSignIn(broker, sim: [("sim_sub", sub)])
        #expect(second["user"] == nil)
        let secondAnswer = try redeem(try #require(try Redirect(try post(second, to: broker)).query["result_code"]), broker).json
        #expect(secondAnswer["user_id"] as? String == userID)
        #expect(secondAnswer["is_new_user"] as? Bool == false)
    }

    @Test("an over-long name in Apple's user field is dropped; the sign-in still succeeds")
    func overlongName() throws {
        let broker = try Self.broker()
        let form = try startSignIn(
            broker, sim: [("sim_first_name", String(repeating: "é", count: 200)), ("sim_last_name", "Short")])
        let back = try Redirect(try post(form, to: broker))
        let answer = try redeem(try #require(back.query["result_code"], "\(back.query)"), broker).json
        let user = try broker.get("/v1/users/\(try #require(answer["user_id"] as? String))", key: broker.key([.read])).json
        let identity = try #require((user["identities"] as? [[String: Any]])?.first)
        #expect(identity["given_name"] == nil || identity["given_name"] is NSNull)
        #expect(identity["family_name"] as? String == "Short")
    }

    @Test("a cancelled sign-in goes back to return_to with Apple's error and the app's state")
    func cancel() throws {
        let broker = try Self.broker()
        let form = try startSignIn(broker, sim: [("sim_cancel", "1")])
        let callback = try post(form, to: broker)
        #expect(callback.status == 303)
        let back = try Redirect(callback)
        #expect(back.base == Self.returnTo)
        #expect(back.query["error"] == "user_cancelled_authorize")
        #expect(back.query["app_state"] == "s-42")
        #expect(back.query["result_code"] == nil)
        #expect(try broker.count("SELECT count(*) FROM apple_identities") == 0)

        // An error Apple does not send is not passed on as is.
        var forged = try startSignIn(broker, sim: [("sim_cancel", "1")])
        forged.fields = forged.fields.map { $0.0 == "error" ? ("error", "evil&result_code=x") : $0 }
        let sanitized = try Redirect(try post(forged, to: broker))
        #expect(sanitized.query["error"] == "apple_error")
        #expect(sanitized.query["result_code"] == nil)
    }

    @Test("a state is good for one callback: a replayed post is refused and writes nothing more")
    func replayedState() throws {
        let broker = try Self.broker()
        let form = try startSignIn(broker)
        #expect(try post(form, to: broker).status == 303)
        let replay = try post(form, to: broker)
        #expect(replay.status == 400)
        #expect(replay.json["code"] as? String == "invalid_state")
        #expect(replay.headers.contains { $0.0.lowercased() == "location" } == false, "nowhere to send a forged callback")
        var forged = form
        forged.fields = form.fields.map { $0.0 == "state" ? ("state", "made-up") : $0 }
        #expect(try post(forged, to: broker).json["code"] as? String == "invalid_state")
        #expect(try broker.count("SELECT count(*) FROM web_results") == 1)
        #expect(try broker.count("SELECT count(*) FROM web_used_states") == 1)

        // A state changed by one character does not open.
        var tampered = form
        tampered.fields = form.fields.map { name, value in
            guard name == "state" else { return (name, value) }
            var bytes = Array(value.utf8)
            bytes[bytes.count - 5] = bytes[bytes.count - 5] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
            return (name, String(decoding: bytes, as: UTF8.self))
        }
        #expect(try post(tampered, to: broker).json["code"] as? String == "invalid_state")

        // A browser (the Back button, a double submit) gets a page, with the way back to the app.
        let page = try broker.client.send(
            .init(
                method: "POST", url: broker.baseURL + "/v1/apple/web/callback",
                headers: [("Content-Type", "application/x-www-form-urlencoded"), ("Accept", "text/html,application/xhtml+xml")]
                    + form.cookie,
                body: Array(FormEncoding.encode(form.fields).utf8)))
        #expect(page.status == 400)
        #expect(page.header("content-type") == "text/html; charset=utf-8")
        #expect(page.header("x-content-type-options") == "nosniff")
        #expect(page.bodyText.contains("already finished or expired"))
        #expect(page.bodyText.contains("href=\"\(Self.returnTo)\""), "\(page.bodyText)")
        #expect(!page.bodyText.contains("{"), "no JSON for people")
    }

    /// Rows in every table of the broker's schema (`query_to_xml` counts each one).
    static func rowsInDatabase(_ broker: TestBroker) throws -> Int {
        try broker.count(
            """
            SELECT coalesce(sum((xpath('/row/n/text()',
                     query_to_xml(format('SELECT count(*) AS n FROM %I.%I', table_schema, table_name), false, true, '')))[1]::text::int), 0)
            FROM information_schema.tables
            WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' AND table_name <> 'schema_migrations'
            """)
    }

    @Test("authorize writes nothing: 300 calls leave every table as it was; a forged callback spends no state")
    func authorizeWritesNothing() throws {
        let broker = try Self.broker()
        let before = try Self.rowsInDatabase(broker)
        for index in 0..<300 {
            let response = try broker.get(
                "/v1/apple/web/authorize?client_id=\(TestBroker.webClientID)&return_to=\(FormEncoding.escape(Self.returnTo))&app_state=\(index)"
            )
            #expect(response.status == 302)
        }
        #expect(try Self.rowsInDatabase(broker) == before)

        // A callback with a genuine state but an id_token that does not verify: an error for the
        // app, no row (a state is spent only by Apple's token for it).
        var form = try startSignIn(broker)
        form.fields = form.fields.map { $0.0 == "id_token" ? ("id_token", "e30.e30.x") : $0 }
        #expect(try Redirect(try post(form, to: broker)).query["error"] != nil)
        #expect(try Self.rowsInDatabase(broker) == before)

        // A browser sent to authorize with a return_to that is not registered gets a page without a link.
        let page = try broker.client.send(
            .init(
                url: broker.baseURL
                    + "/v1/apple/web/authorize?client_id=\(TestBroker.webClientID)&return_to=https://evil.example.com/",
                headers: [("Accept", "text/html")]))
        #expect(page.status == 400)
        #expect(page.header("content-type") == "text/html; charset=utf-8")
        #expect(!page.bodyText.contains("evil.example.com"))
    }

    @Test("an id_token whose nonce is not the one stored for the state is refused, and nothing of the user is kept")
    func wrongNonce() throws {
        let broker = try Self.broker()
        let form = try startSignIn(broker) { query in query["nonce"] = String(repeating: "0", count: 64) }
        let back = try Redirect(try post(form, to: broker))
        #expect(back.query["error"] == "nonce_mismatch")
        #expect(back.query["result_code"] == nil)
        #expect(try broker.count("SELECT count(*) FROM apple_identities") == 0)
        // The name came with a token that did not verify: it belongs to nobody the broker can
        // name, so it is stored nowhere, and the state is not spent either.
        #expect(try broker.count("SELECT count(*) FROM web_used_states") == 0)
        #expect(try broker.count("SELECT count(*) FROM apple_identities WHERE given_name IS NOT NULL") == 0)
    }

    @Test("when Apple cannot exchange the code, the verified user and the one-time name are kept")
    func exchangeFailureKeepsName() throws {
        let broker = try Self.broker()
        var faults = FaultSettings()
        faults.errorRate = 1
        faults.errorStatuses = [503]
        faults.endpoints = ["token"]
        broker.simulator.faults = faults
        let back = try Redirect(try post(try startSignIn(broker, sim: [("sim_first_name", "Grace")]), to: broker))
        #expect(back.query["error"] == "apple_unavailable")
        #expect(
            try broker.count("SELECT count(*) FROM apple_identities WHERE given_name = 'Grace' AND client_id = 'com.example.web'")
                == 1)
        // One sign-in, one outcome: saving the user afterwards is not a second login.
        let metrics = try broker.get("/metrics").bodyText
        #expect(metrics.contains(#"login_requests_total{outcome="apple_unavailable"} 1"#))
        #expect(!metrics.contains(#"login_requests_total{outcome="success"}"#), "\(metrics)")
    }

    @Test("only return_to URLs registered for the client id are accepted: no open redirect")
    func unregisteredReturnTo() throws {
        let broker = try Self.broker()
        for returnTo in [
            "https://evil.example.com/steal", Self.returnTo + "/../x", Self.returnTo + "?x=1",
            "https://app.example.com/apple/done#f",
        ] {
            let response = try broker.get(
                "/v1/apple/web/authorize?client_id=\(TestBroker.webClientID)&return_to=\(FormEncoding.escape(returnTo))")
            #expect(response.status == 400, "\(returnTo)")
            #expect(response.json["code"] as? String == "return_to_not_registered")
        }
        let otherClient = try broker.get(
            "/v1/apple/web/authorize?client_id=\(TestBroker.clientID)&return_to=\(FormEncoding.escape(Self.returnTo))")
        #expect(otherClient.json["code"] as? String == "web_client_unknown")
        #expect(try Self.rowsInDatabase(broker) == 0)

        let unconfigured = try TestBroker()
        let response = try unconfigured.get(
            "/v1/apple/web/authorize?client_id=\(TestBroker.webClientID)&return_to=\(FormEncoding.escape(Self.returnTo))")
        #expect(response.status == 404)
        #expect(response.json["code"] as? String == "web_signin_not_configured")
    }

    @Test("Apple's page refuses a redirect_uri that is not a registered Return URL; web id_tokens carry no real_user_status")
    func appleLikeAuthorize() throws {
        let broker = try Self.broker()
        for redirectURI in [
            "https://evil.example.com/cb", Self.publicURL + "/v1/apple/web/callback/x",
            "http://broker.example.com/v1/apple/web/callback",
        ] {
            let query = WebSignInService.query([
                ("client_id", TestBroker.webClientID), ("redirect_uri", redirectURI), ("response_type", "code id_token"),
                ("response_mode", "form_post"), ("scope", "name email"), ("state", "s"),
            ])
            let page = try broker.client.send(.init(url: broker.simulator.baseURL + "/auth/authorize?" + query))
            #expect(page.status == 400, "\(redirectURI)")
            #expect(page.bodyText.contains("invalid_request"))
        }
        let form = try startSignIn(broker)
        let idToken = try #require(form.fields.first { $0.0 == "id_token" }?.1)
        let payload = try #require(idToken.split(separator: ".").dropFirst().first)
        let claims = try JSONSerialization.jsonObject(with: Data(try #require(Base64URL.decode(payload)))) as? [String: Any]
        #expect(claims?["real_user_status"] == nil, "Apple sends real_user_status to native apps only")
    }

    @Test(
        "after a purge a pg_dump holds no sub, e-mail or name, nor an unkeyed SHA-256 of any (web results and notifications included)"
    )
    func nothingPersonalAfterPurge() throws {
        let broker = try TestBroker(
            roles: [.api, .notifications, .deletion],
            extra: [
                "BROKER_PUBLIC_URL": Self.publicURL, "APPLE_WEB_RETURN_URLS": "\(TestBroker.webClientID)=\(Self.returnTo)",
                "BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1",
            ])
        broker.simulator.registerReturnURLs(clientID: TestBroker.webClientID, urls: [Self.publicURL + "/v1/apple/web/callback"])
        // A web sign-in whose result is never redeemed: its answer (sub, e-mail, name) waits in web_results.
        let back = try Redirect(
            try post(try startSignIn(broker, sim: [("sim_first_name", "Augusta"), ("sim_last_name", "Byronesque")]), to: broker))
        #expect(back.query["result_code"] != nil)
        let identity = try broker.pool.query("SELECT user_id, sub, email FROM apple_identities").single()
        let userID = try identity.decode(UUID.self, 0)
        let sub = try identity.decode(String.self, 1)
        let email = try identity.decode(String.self, 2)
        // A notification about the user: the inbox and the audit log name the subject.
        var notification = NotificationRequest(
            url: broker.baseURL + "/v1/apple/notifications", type: "email-disabled", sub: sub, clientID: TestBroker.webClientID)
        notification.eventTimeMilliseconds = Int64(Date().timeIntervalSince1970 * 1000)
        #expect(try broker.simulator.sendNotification(notification).status == 200)

        let body = #"{"user_id":"\#(userID.lowercasedString)","reason":"asked in the app","requested_by":"support"}"#
        #expect(try broker.post("/v1/deletions", json: body, key: broker.key([.compliance])).status == 202)
        try waitUntil(seconds: 30) { try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 1 }

        let pgDump = try #require(
            (try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql"))?.sorted().last
                .map { "/usr/lib/postgresql/\($0)/bin/pg_dump" } ?? Repository.executable("pg_dump"))
        let dump = try ChildProcess.run(pgDump, ["--data-only", "--no-owner", "-d", broker.environment["DATABASE_URL"]!])
        #expect(dump.status == 0, "\(dump.output.prefix(500))")
        #expect(dump.output.contains("tombstones"), "the dump is the broker's")
        for (what, text) in [("sub", sub), ("e-mail", email), ("given name", "Augusta"), ("family name", "Byronesque")] {
            #expect(!dump.output.contains(text), "the \(what) survived the purge")
            #expect(!dump.output.contains(SHA256.hexHash(text)), "the SHA-256 of the \(what) survived the purge")
        }
        // What stands for the sub afterwards is keyed: a tombstone and the notification's inbox row.
        #expect(try broker.count("SELECT count(*) FROM tombstones WHERE sub_hash LIKE '%:%'") == 1)
        #expect(try broker.count("SELECT count(*) FROM apple_notifications WHERE sub_hash LIKE '%:%'") == 1)
        #expect(try broker.count("SELECT count(*) FROM web_results") == 0)
    }

    @Test("a result code cannot be redeemed with a key limited to another app, nor spent by it")
    func redeemWithLimitedKey() throws {
        let broker = try TestBroker(extra: [
            "BROKER_PUBLIC_URL": Self.publicURL, "APPLE_WEB_RETURN_URLS": "\(TestBroker.webClientID)=\(Self.returnTo)",
            "APPLE_APP_GROUPS": "\(TestBroker.clientID);\(TestBroker.webClientID)",
        ])
        broker.simulator.registerReturnURLs(clientID: TestBroker.webClientID, urls: [Self.publicURL + "/v1/apple/web/callback"])
        let code = try #require(try Redirect(try post(try startSignIn(broker), to: broker)).query["result_code"])
        let appOnly = try APIKeyStore(pool: broker.pool).create(name: "app", scopes: [.login], clientIDs: [TestBroker.clientID])
            .secret
        let body = String(decoding: try JSONSerialization.data(withJSONObject: ["result_code": code]), as: UTF8.self)
        let refused = try broker.post("/v1/apple/web/redeem", json: body, key: appOnly)
        #expect(refused.status == 403)
        #expect(refused.json["code"] as? String == "client_not_allowed")
        #expect(try redeem(code, broker).status == 200, "the code was not spent by the refused attempt")
    }

    @Test("a cancel posted without a state (unconfirmed whether Apple sends one, §10.6) does not strand the browser")
    func cancelWithoutState() throws {
        // One return URL registered: the browser goes back there with Apple's error.
        let single = try TestBroker(extra: [
            "BROKER_PUBLIC_URL": Self.publicURL, "APPLE_WEB_RETURN_URLS": "\(TestBroker.webClientID)=\(Self.returnTo)",
        ])
        single.simulator.registerReturnURLs(clientID: TestBroker.webClientID, urls: [Self.publicURL + "/v1/apple/web/callback"])
        let form = try startSignIn(single, sim: [("sim_cancel", "nostate")])
        #expect(form["state"] == nil, "the simulator plays a cancel without state")
        let back = try post(form, to: single)
        #expect(back.status == 303)
        let redirect = try Redirect(back)
        #expect(redirect.base == Self.returnTo)
        #expect(redirect.query["error"] == "user_cancelled_authorize")

        // Several: a browser gets a page saying what happened (no JSON), an API client the problem.
        let several = try Self.broker()
        let stateless = try startSignIn(several, sim: [("sim_cancel", "nostate")])
        let page = try several.client.send(
            .init(
                method: "POST", url: several.baseURL + "/v1/apple/web/callback",
                headers: [("Content-Type", "application/x-www-form-urlencoded"), ("Accept", "text/html")],
                body: Array(FormEncoding.encode(stateless.fields).utf8)))
        #expect(page.status == 400)
        #expect(page.header("content-type") == "text/html; charset=utf-8")
        #expect(page.bodyText.contains("Sign-in cancelled"))
        #expect(try post(stateless, to: several).json["code"] as? String == "invalid_state")
    }
}
