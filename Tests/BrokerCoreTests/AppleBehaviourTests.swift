import AppleID
import AppleSimulator
import BrokerAPI
import BrokerCore
import Foundation
import HTTPClient
import PostgresClient
import TestSupport
import Testing

/// Where real Apple is less kind than a simple simulator (protocol reference §10): consent
/// per app group, every way a grant dies, no storm when Apple's answer is no verdict, and a
/// key set that must never be replaced by a useless one. All over HTTP against the simulator.
@Suite("Apple's real behaviour", .offPool)
struct AppleBehaviourTests {
    static let app = TestBroker.clientID  // com.example.app
    static let other = TestBroker.webClientID  // com.example.web, a second app here
    /// Two apps of one team, not grouped: each is a primary App ID of its own.
    static let twoApps = [
        "APPLE_APP_GROUPS": "\(app);\(other)", "BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1",
    ]

    /// One user signed in to each client id with a code (a refresh token each).
    private func userOfBothApps(_ broker: TestBroker) throws -> (id: UUID, sub: String) {
        try broker.signIn(clients: [Self.app, Self.other])
    }

    private func credentialState(_ broker: TestBroker, _ id: UUID, clientID: String? = nil) throws -> String? {
        let query = clientID.map { "?client_id=\($0)" } ?? ""
        return try broker.get("/v1/users/\(id.lowercasedString)/credential-state\(query)", key: broker.key([.read])).json["state"]
            as? String
    }

    private func notify(_ broker: TestBroker, _ type: String, sub: String, clientID: String) throws -> NotificationResult {
        try broker.simulator.sendNotification(
            NotificationRequest(url: broker.baseURL + "/v1/apple/notifications", type: type, sub: sub, clientID: clientID))
    }

    @Test("two apps in one team: a consent-revoked for one leaves the other authorized, and its token is revoked at deletion")
    func consentPerApp() throws {
        let broker = try TestBroker(roles: [.api, .notifications, .deletion], extra: Self.twoApps)
        let (userID, sub) = try userOfBothApps(broker)
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE user_id = \(userID)") == 2)

        #expect(try notify(broker, "consent-revoked", sub: sub, clientID: Self.other).status == 200)
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE user_id = \(userID) AND client_id = \(Self.app)") == 1)
        #expect(
            try broker.count("SELECT count(*) FROM apple_tokens WHERE user_id = \(userID) AND client_id = \(Self.other)") == 0)
        #expect(try credentialState(broker, userID, clientID: Self.app) == "authorized")
        #expect(try credentialState(broker, userID, clientID: Self.other) == "revoked")
        #expect(try credentialState(broker, userID) == "authorized", "authorized while any group is")
        let event = try broker.pool.query("SELECT payload FROM outbox_events WHERE type = 'consent.revoked'").single()
        #expect(try event.decode(PostgresJSON.self, 0).text.contains(#""client_id": "\#(Self.other)""#))
        // The user record shows consent per group.
        let user = try broker.get("/v1/users/\(userID.lowercasedString)", key: broker.key([.read])).json
        let apps = ((user["identities"] as? [[String: Any]])?.first?["apps"] as? [[String: Any]]) ?? []
        let consent = Dictionary(
            uniqueKeysWithValues: apps.map { ($0["client_id"] as? String ?? "", $0["consent"] as? String ?? "") })
        #expect(consent == [Self.app: "active", Self.other: "revoked"])

        // email-disabled for the other app changes only that app's forwarding.
        #expect(try notify(broker, "email-disabled", sub: sub, clientID: Self.other).status == 200)
        #expect(
            try broker.count(
                "SELECT count(*) FROM apple_grants WHERE app_id = \(Self.app) AND email_forwarding = 'disabled'") == 0)

        // Deleting the user revokes the app's live token at Apple.
        let deletion = try broker.post(
            "/v1/deletions", json: #"{"user_id":"\#(userID.lowercasedString)","reason":"test","requested_by":"test"}"#,
            key: broker.key([.compliance]))
        #expect(deletion.status == 202, "\(deletion.bodyText)")
        try waitUntil { try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 1 }
        let revoked = broker.simulator.revocations.filter { $0.outcome == "revoked" }
        #expect(revoked.map(\.clientID) == [Self.app])
    }

    @Test("grouped apps share consent: a notification names the primary App ID and revokes the whole group")
    func groupedApps() throws {
        // Default grouping: every client id in one group, the first (com.example.app) primary.
        let broker = try TestBroker(roles: [.api, .notifications])
        broker.simulator.setAppGroups([[Self.app, Self.other]])
        let (userID, sub) = try userOfBothApps(broker)
        // The web Services ID's consent is revoked: Apple's aud is the primary App ID.
        #expect(try notify(broker, "consent-revoked", sub: sub, clientID: Self.other).status == 200)
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE user_id = \(userID)") == 0)
        #expect(try credentialState(broker, userID) == "revoked")
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE app_id = \(Self.app) AND consent = 'revoked'") == 1)
    }

    @Test("a web-only deployment accepts notifications for its primary App ID")
    func primaryOutsideClientIDs() throws {
        let broker = try TestBroker(
            roles: [.api, .notifications],
            extra: ["APPLE_CLIENT_IDS": Self.other, "APPLE_APP_GROUPS": "com.example.ios=\(Self.other)"])
        broker.simulator.setAppGroups([["com.example.ios", Self.other]])
        let minted = try broker.mint { $0.clientID = Self.other }
        #expect(try broker.login(["identity_token": minted.idToken]).status == 200)
        let result = try notify(broker, "email-disabled", sub: minted.sub, clientID: Self.other)
        #expect(result.status == 200)
        #expect(
            try broker.count(
                "SELECT count(*) FROM apple_grants WHERE app_id = 'com.example.ios' AND email_forwarding = 'disabled'") == 1)
    }

    @Test("invalid_request on the sweep's refresh is a revocation: credential state revoked within one sweep interval")
    func invalidRequestRevokes() throws {
        let broker = try TestBroker(roles: [.api, .sweep], extra: ["BROKER_SWEEP_INTERVAL_SECONDS": "1"])
        let minted = try broker.mint { $0.withCode = true }
        let login = try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!])
        let userID = try #require(UUID(uuidString: login.json["user_id"] as? String ?? ""))
        var faults = FaultSettings()
        faults.revokedGrantError = "invalid_request"
        broker.simulator.faults = faults
        // The user stops using Sign in with Apple; Apple's notification never arrives.
        #expect(broker.simulator.revokeConsent(teamID: TestBroker.teamID, sub: minted.sub) > 0)
        try broker.pool.query("UPDATE apple_tokens SET next_validation_at = now()")
        try waitUntil(seconds: 5) { try credentialState(broker, userID) == "revoked" }
        #expect(try credentialState(broker, userID) == "revoked")
        #expect(try broker.count("SELECT count(*) FROM apple_tokens") == 0)
    }

    @Test("invalid_client on every refresh: the breaker stops the sweep after a handful of calls, each token backs off")
    func noStormOnInvalidClient() throws {
        let broker = try TestBroker(
            roles: [.api, .sweep],
            extra: [
                "BROKER_SWEEP_INTERVAL_SECONDS": "1", "BROKER_SWEEP_BREAKER_SECONDS": "3600", "BROKER_SWEEP_CONCURRENCY": "1",
            ])
        for _ in 0..<10 {
            let minted = try broker.mint { $0.withCode = true }
            #expect(try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!]).status == 200)
        }
        var faults = FaultSettings()
        faults.forceInvalidClient = true
        broker.simulator.faults = faults
        let before = broker.simulator.statistics.token
        try broker.pool.query("UPDATE apple_tokens SET next_validation_at = now()")
        // The sample line: the gauge's HELP text contains "refresh_sweep_breaker_open 1" too.
        try waitUntil(seconds: 10) { try broker.get("/metrics").bodyText.contains("\nrefresh_sweep_breaker_open 1") }
        Thread.sleep(forTimeInterval: 2.5)  // two more sweep intervals: nothing more is tried
        // Three tokens tried (each up to twice: RetryPolicy(maximumAttempts: 2) retries only 5xx).
        let calls = broker.simulator.statistics.token - before
        #expect(calls == 3, "\(calls) refresh calls for 10 tokens")
        let metrics = try broker.get("/metrics").bodyText
        #expect(metrics.contains(#"refresh_sweep_breaker_trips_total{error="invalid_client"} 1"#))
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE validation_failures = 1") == 3)
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") == 0, "no verdict, no revocation")
        // Tried tokens back off ten minutes; untried ones stay due for when the breaker closes.
        #expect(
            try broker.count(
                "SELECT count(*) FROM apple_tokens WHERE validation_failures = 1 AND next_validation_at > now() + interval '9 minutes'"
            ) == 3)
        #expect(
            try broker.count("SELECT count(*) FROM apple_tokens WHERE validation_failures = 0 AND next_validation_at <= now()")
                == 7)
    }

    @Test("one token failing again and again backs off exponentially, capped at the validation interval")
    func perTokenBackoff() throws {
        let broker = try TestBroker(
            roles: [.api, .sweep], extra: ["BROKER_SWEEP_INTERVAL_SECONDS": "1", "BROKER_REFRESH_VALIDATION_SECONDS": "3000"])
        let minted = try broker.mint { $0.withCode = true }
        #expect(try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!]).status == 200)
        var faults = FaultSettings()
        faults.forceInvalidClient = true
        broker.simulator.faults = faults
        var delays: [Int] = []
        for failures in 1...5 {
            // Time passes: the token is due again.
            try broker.pool.query("UPDATE apple_tokens SET next_validation_at = now()")
            try waitUntil(seconds: 5) { try broker.count("SELECT validation_failures FROM apple_tokens") == failures }
            delays.append(try broker.count("SELECT EXTRACT(EPOCH FROM next_validation_at - now())::int FROM apple_tokens"))
        }
        // 600, 1200, 2400, then the 3000 s cap (each plus up to a tenth of jitter).
        for (delay, expected) in zip(delays, [600, 1200, 2400, 3000, 3000]) {
            #expect(delay >= expected - 5 && delay <= expected + expected / 10 + 5, "delays \(delays)")
        }
        #expect(try broker.count("SELECT count(*) FROM apple_tokens") == 1, "never revoked for a non-verdict")
    }

    @Test("a key set with no usable key never replaces a good one; an unknown kid while keys fail is 503, not 401")
    func keySetRobustness() throws {
        let broker = try TestBroker()
        let early = try broker.mint()  // signed with the key the broker has cached
        #expect(try broker.login(["identity_token": try broker.mint().idToken]).status == 200)
        var faults = FaultSettings()
        faults.emptyKeySet = true
        broker.simulator.faults = faults
        _ = try broker.simulator.rotateKeys()
        let unknown = try broker.login(["identity_token": try broker.mint().idToken])
        #expect(unknown.status == 503, "\(unknown.bodyText)")
        #expect(unknown.json["code"] as? String == "apple_unavailable")
        #expect(unknown.header("retry-after") != nil)
        // The empty answer did not replace the good set: a token of the old key still verifies.
        #expect(try broker.login(["identity_token": early.idToken]).status == 200)
        #expect(try broker.get("/metrics").bodyText.contains("apple_jwks_keys 1"))
    }

    @Test("an unknown kid while Apple's key endpoint fails is 503 with Retry-After")
    func unknownKidDuringOutage() throws {
        let broker = try TestBroker()
        var faults = FaultSettings()
        faults.errorRate = 1
        faults.errorStatuses = [500]
        faults.endpoints = ["keys"]
        broker.simulator.faults = faults
        _ = try broker.simulator.rotateKeys()
        let answer = try broker.login(["identity_token": try broker.mint().idToken])
        #expect(answer.status == 503, "\(answer.bodyText)")
        #expect(answer.json["code"] as? String == "apple_unavailable")
    }

    @Test("the notification endpoint reads the JWS whatever the Content-Type says")
    func anyContentType() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        let minted = try broker.mint()
        #expect(try broker.login(["identity_token": minted.idToken]).status == 200)
        for contentType in ["text/plain", "application/x-www-form-urlencoded", nil] {
            let (_, payload) = try broker.simulator.signNotification(
                NotificationRequest(url: "", type: "email-disabled", sub: minted.sub, clientID: Self.app))
            let headers = contentType.map { [("Content-Type", $0)] } ?? []
            let answer = try broker.client.send(
                .init(
                    method: "POST", url: broker.baseURL + "/v1/apple/notifications", headers: headers,
                    body: Array(#"{"payload":"\#(payload)"}"#.utf8)))
            #expect(answer.status == 200, "\(contentType ?? "none"): \(answer.bodyText)")
        }
    }
}

/// Codes the broker did not start: Sign in with Apple JS popups and Android libraries send the
/// app's own redirect_uri to Apple, which binds the code to it (§10.4).
@Suite("Web codes from outside the broker", .offPool)
struct ExternalWebCodeTests {
    static let returnURL = "https://web.example.com/apple/callback"

    @Test("an external web code is exchanged with its registered redirect_uri; an unregistered one never reaches Apple")
    func registeredRedirectURI() throws {
        let broker = try TestBroker(extra: ["APPLE_REDIRECT_URIS": "\(TestBroker.webClientID)=\(Self.returnURL)"])
        func mint() throws -> MintedToken {
            try broker.mint {
                $0.clientID = TestBroker.webClientID
                $0.withCode = true
                $0.redirectURI = Self.returnURL
            }
        }
        let minted = try mint()
        let login = try broker.login([
            "identity_token": minted.idToken, "authorization_code": minted.code!, "redirect_uri": Self.returnURL,
        ])
        #expect(login.status == 200, "\(login.bodyText)")
        #expect(login.json["refresh_token_stored"] as? Bool == true)

        // Without it, Apple refuses the code it bound to the redirect_uri.
        let unbound = try mint()
        let refused = try broker.login(["identity_token": unbound.idToken, "authorization_code": unbound.code!])
        #expect(refused.status == 400)
        #expect(refused.json["code"] as? String == "authorization_code_invalid")

        // An unregistered one is refused before Apple is asked.
        let calls = broker.simulator.statistics.token
        for redirectURI in ["https://evil.example.com/cb", Self.returnURL + "/x", "http://web.example.com/apple/callback"] {
            let other = try mint()
            let answer = try broker.login([
                "identity_token": other.idToken, "authorization_code": other.code!, "redirect_uri": redirectURI,
            ])
            #expect(answer.status == 400, "\(redirectURI): \(answer.bodyText)")
            #expect(answer.json["code"] as? String == "redirect_uri_not_registered")
        }
        // Registered for another client id is not registered for this one.
        let native = try broker.mint { $0.withCode = true }
        let crossed = try broker.login([
            "identity_token": native.idToken, "authorization_code": native.code!, "redirect_uri": Self.returnURL,
        ])
        #expect(crossed.json["code"] as? String == "redirect_uri_not_registered")
        #expect(broker.simulator.statistics.token == calls, "nothing reached Apple")
    }
}

/// Deleting a user the broker holds no refresh token for (§10.3): a fresh authorization code
/// handed over with the request, or else an honest `manual_required`.
@Suite("Deletion without a stored token", .offPool)
struct DeletionWithoutTokenTests {
    static let fast = ["BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1"]

    private func deleteAndWait(_ broker: TestBroker, _ body: [String: Any]) throws -> [String: Any] {
        let data = try JSONSerialization.data(withJSONObject: body)
        let answer = try broker.post("/v1/deletions", json: String(decoding: data, as: UTF8.self), key: broker.key([.compliance]))
        #expect(answer.status == 202, "\(answer.bodyText)")
        let id = try #require(answer.json["deletion_id"] as? String)
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline,
            try broker.count("SELECT count(*) FROM deletion_requests WHERE state NOT IN ('done', 'failed')") > 0
        {
            Thread.sleep(forTimeInterval: 0.05)
        }
        return try broker.get("/v1/deletions/\(id)", key: broker.key([.compliance])).json
    }

    private func userDeletedPayload(_ broker: TestBroker) throws -> String {
        try broker.pool.query("SELECT payload::text FROM outbox_events WHERE type = 'user.deleted'").single().decode(
            String.self, 0)
    }

    @Test("a deletion with a fresh code revokes the tokens it yields, and says revoked")
    func freshCode() throws {
        let broker = try TestBroker(roles: [.api, .deletion], extra: Self.fast)
        // Signed in without a code: the broker holds no token for this user.
        let minted = try broker.mint()
        let login = try broker.login(["identity_token": minted.idToken])
        #expect(login.json["refresh_token_stored"] as? Bool == false)
        let userID = try #require(login.json["user_id"] as? String)
        // The app's "delete my account" screen re-authenticated the user: a fresh code.
        let code = broker.simulator.issueCode(teamID: TestBroker.teamID, sub: minted.sub, clientID: TestBroker.clientID)
        let record = try deleteAndWait(
            broker,
            [
                "user_id": userID, "reason": "deleted in the app", "requested_by": "test", "authorization_code": code,
            ])
        #expect(record["state"] as? String == "done")
        #expect(record["apple_revocation"] as? String == "revoked")
        let steps = (record["steps"] as? [[String: Any]] ?? []).map {
            "\($0["step"] as? String ?? "") \($0["outcome"] as? String ?? "")"
        }
        #expect(steps.contains("code_exchange exchanged"), "\(steps)")
        let revoked = broker.simulator.revocations.filter { $0.sub == minted.sub && $0.outcome == "revoked" }
        #expect(revoked.map(\.tokenTypeHint) == ["refresh_token"], "\(revoked)")
        let accessCalls = broker.simulator.revocations.filter { $0.sub == minted.sub && $0.tokenTypeHint == "access_token" }
        #expect(accessCalls.map(\.outcome) == ["already_revoked"], "the grant ended with the refresh token")
        #expect(try userDeletedPayload(broker).contains(#""apple_revocation": "revoked""#))
        #expect(
            try broker.count("SELECT count(*) FROM deletion_requests WHERE authorization_code IS NOT NULL") == 0, "no code kept")
    }

    @Test("nothing to revoke and no code: done, with apple_revocation manual_required in the answer, user.deleted and the metric")
    func manualRequired() throws {
        let broker = try TestBroker(roles: [.api, .deletion], extra: Self.fast)
        let minted = try broker.mint()
        let userID = try #require(try broker.login(["identity_token": minted.idToken]).json["user_id"] as? String)
        let record = try deleteAndWait(broker, ["user_id": userID, "reason": "test", "requested_by": "test"])
        #expect(record["state"] as? String == "done")
        #expect(record["apple_revocation"] as? String == "manual_required")
        let steps = (record["steps"] as? [[String: Any]] ?? []).map {
            "\($0["step"] as? String ?? "") \($0["outcome"] as? String ?? "")"
        }
        #expect(steps.contains("nothing_to_revoke manual_revocation_required"), "\(steps)")
        #expect(try userDeletedPayload(broker).contains(#""apple_revocation": "manual_required""#))
        #expect(try broker.get("/metrics").bodyText.contains(#"deletion_apple_revocations_total{outcome="manual_required"} 1"#))
    }

    @Test("a login's access token is kept and revoked at deletion beside the refresh token")
    func accessTokenRevoked() throws {
        let broker = try TestBroker(roles: [.api, .deletion], extra: Self.fast)
        let (userID, sub) = try broker.signIn()
        #expect(
            try broker.count("SELECT count(*) FROM apple_tokens WHERE access_token IS NOT NULL AND access_expires_at > now()")
                == 1)
        let record = try deleteAndWait(broker, ["user_id": userID.lowercasedString, "reason": "test", "requested_by": "test"])
        #expect(record["apple_revocation"] as? String == "revoked")
        let hints = broker.simulator.revocations.filter { $0.sub == sub }.map { "\($0.tokenTypeHint ?? "") \($0.outcome)" }
        #expect(hints == ["refresh_token revoked", "access_token already_revoked"], "\(hints)")
        let steps = (record["steps"] as? [[String: Any]] ?? []).map {
            "\($0["step"] as? String ?? "") \($0["outcome"] as? String ?? "")"
        }
        #expect(steps.contains("revoke_access_token revoked"), "\(steps)")
    }

    @Test("a code of another user revokes nothing of theirs; a code for an unknown client or redirect_uri is refused")
    func wrongCodes() throws {
        let broker = try TestBroker(roles: [.api, .deletion], extra: Self.fast)
        let victim = try broker.mint()
        let userID = try #require(try broker.login(["identity_token": victim.idToken]).json["user_id"] as? String)
        let stranger = try broker.simulator.mintToken(
            {
                var r = TokenRequest(clientID: TestBroker.clientID)
                r.teamID = TestBroker.teamID
                return r
            }())
        let theirCode = broker.simulator.issueCode(teamID: TestBroker.teamID, sub: stranger.sub, clientID: TestBroker.clientID)
        for (extra, code) in [
            (["client_id": "com.nowhere"], "invalid_client_id"),
            (
                ["client_id": TestBroker.webClientID, "redirect_uri": "https://evil.example.com/cb"],
                "redirect_uri_not_registered"
            ),
        ] as [([String: String], String)] {
            var body: [String: Any] = ["user_id": userID, "reason": "t", "requested_by": "t", "authorization_code": "c"]
            body.merge(extra) { $1 }
            let data = try JSONSerialization.data(withJSONObject: body)
            let answer = try broker.post(
                "/v1/deletions", json: String(decoding: data, as: UTF8.self), key: broker.key([.compliance]))
            #expect(answer.status == 400 && answer.json["code"] as? String == code, "\(answer.bodyText)")
        }
        let record = try deleteAndWait(
            broker,
            [
                "user_id": userID, "reason": "t", "requested_by": "t", "authorization_code": theirCode,
            ])
        #expect(record["apple_revocation"] as? String == "manual_required")
        let steps = (record["steps"] as? [[String: Any]] ?? []).map {
            "\($0["step"] as? String ?? "") \($0["outcome"] as? String ?? "")"
        }
        #expect(steps.contains("code_exchange wrong_user"), "\(steps)")
        #expect(broker.simulator.revocations.filter { $0.outcome == "revoked" }.isEmpty, "nothing of the stranger's was revoked")
    }
}

/// The 60 days after a team transfer, when tokens carry `transfer_sub` (TN3159).
@Suite("Logins after a team transfer", .offPool)
struct TransferLoginTests {
    @Test("a login carrying transfer_sub joins the old user and retires the old team's identity and tokens")
    func retiresOldTeam() throws {
        let broker = try TestBroker(roles: [.api, .sweep], extra: ["BROKER_SWEEP_INTERVAL_SECONDS": "1"])
        let (userID, _) = try broker.signIn()
        // What the old team left: its identity (with the transfer identifier `transfer export`
        // recorded) and a refresh token this team cannot refresh or revoke.
        try broker.pool.query("UPDATE apple_identities SET transfer_sub = 'T-9', team_id = 'OLDTEAM001'")
        let moved = try broker.login(["identity_token": try broker.mint { $0.transferSub = "T-9" }.idToken])
        #expect(moved.status == 200)
        #expect(moved.json["user_id"] as? String == userID.lowercasedString)
        #expect(
            try broker.count("SELECT count(*) FROM apple_identities WHERE team_id = 'OLDTEAM001' AND transferred_at IS NOT NULL")
                == 1)
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE revoked_at IS NOT NULL") == 1)

        // Even an old-team token left live is never refreshed with this team's credentials.
        try broker.pool.query("UPDATE apple_tokens SET revoked_at = NULL, next_validation_at = now()")
        let calls = broker.simulator.statistics.token
        Thread.sleep(forTimeInterval: 2.5)
        #expect(broker.simulator.statistics.token == calls)
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE last_validated_at IS NOT NULL") == 0)
    }
}

/// Apple's first-authorization `user` field is unsigned: anyone can put any e-mail in it.
@Suite("The unsigned e-mail", .offPool)
struct UnsignedEmailTests {
    @Test("a token without e-mail and user.email = the victim's: email stays null, the claim is unverified_email only")
    func unsignedEmailIsNotEmail() throws {
        let broker = try TestBroker()
        let minted = try broker.mint { $0.omitEmail = true }
        let login = try broker.login(["identity_token": minted.idToken, "user": ["email": "victim@example.com"]])
        #expect(login.status == 200)
        #expect(login.json["email"] is NSNull, "\(login.bodyText)")
        #expect(login.json["email_verified"] as? Bool == false)
        #expect(login.json["unverified_email"] as? String == "victim@example.com")
        #expect(try broker.count("SELECT count(*) FROM apple_identities WHERE email IS NOT NULL") == 0)
        // Later logins never fill it in either. A later user field is a first authorization again
        // (issue 35: Apple sends it only then): its e-mail replaces the unverified one, still
        // never `email`.
        let again = try broker.login([
            "identity_token": try broker.mint {
                $0.sub = minted.sub
                $0.omitEmail = true
            }.idToken,
            "user": ["email": "other@example.com"],
        ])
        #expect(again.json["email"] is NSNull)
        #expect(again.json["unverified_email"] as? String == "other@example.com")
        let userID = try #require(login.json["user_id"] as? String)
        let identity = try broker.get("/v1/users/\(userID)", key: broker.key([.read])).json["identities"] as? [[String: Any]]
        #expect(identity?.first?["email"] == nil || identity?.first?["email"] is NSNull)
        #expect(identity?.first?["unverified_email"] as? String == "other@example.com")
        #expect(try broker.count("SELECT count(*) FROM apple_identities WHERE email IS NOT NULL") == 0)
    }

    @Test("with a verified e-mail, email is the token's; an unsigned one that differs is only ever unverified_email")
    func verifiedWins() throws {
        let broker = try TestBroker()
        let minted = try broker.mint()
        let login = try broker.login(["identity_token": minted.idToken, "user": ["email": "victim@example.com"]])
        #expect(login.json["email"] as? String == minted.email)
        #expect(login.json["email_verified"] as? Bool == true)
        #expect(login.json["unverified_email"] as? String == "victim@example.com")
        // The same address as the token's is not kept twice.
        let same = try broker.mint()
        let plain = try broker.login(["identity_token": same.idToken, "user": ["email": same.email!]])
        #expect(plain.json["unverified_email"] is NSNull)
    }
}
