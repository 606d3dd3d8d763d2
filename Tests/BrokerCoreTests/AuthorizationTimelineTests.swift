import AppleSimulator
import BrokerCore
import Foundation
import HTTPClient
import PostgresClient
import TestSupport
import Testing

/// Issue 35: Apple's verdicts ordered by Apple's clock (protocol reference §12). Every verdict
/// is about one authorization; a verified sign-in proves the authorization at its Apple time.
/// Each test fails on the code before the issue.
@Suite("Revocation by Apple's clock", .offPool)
struct AuthorizationTimelineTests {
    static let sweep = [
        "BROKER_SWEEP_INTERVAL_SECONDS": "1", "BROKER_SWEEP_CONCURRENCY": "1", "BROKER_SWEEP_BREAKER_SECONDS": "3600",
    ]
    /// The app and its web Services ID share one authorization at Apple.
    static let grouped = ["APPLE_APP_GROUPS": "\(TestBroker.clientID)=\(TestBroker.webClientID)"]

    /// Waits until the wall clock is in a later second than `date`: a sign-in then carries an
    /// `iat` (whole seconds) after it.
    private func nextSecond(after date: Date) {
        while Int(Date().timeIntervalSince1970) <= Int(date.timeIntervalSince1970) { Thread.sleep(forTimeInterval: 0.01) }
    }

    private func credentialState(_ broker: TestBroker, _ id: UUID, clientID: String? = nil) throws -> String? {
        let query = clientID.map { "?client_id=\($0)" } ?? ""
        return try broker.get("/v1/users/\(id.lowercasedString)/credential-state\(query)", key: broker.key([.read])).json["state"]
            as? String
    }

    /// Signs the user (a new one when `sub` is nil) in to `clientID` with a code; the user's id and sub.
    private func signIn(_ broker: TestBroker, sub: String? = nil, clientID: String = TestBroker.clientID) throws -> (
        id: UUID, sub: String
    ) {
        let minted = try broker.mint {
            $0.sub = sub
            $0.clientID = clientID
            $0.withCode = true
        }
        let login = try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!])
        #expect(login.status == 200, "\(login.bodyText)")
        return (try #require(UUID(uuidString: login.json["user_id"] as? String ?? "")), minted.sub)
    }

    private func events(_ broker: TestBroker, _ type: String) throws -> Int {
        try broker.count("SELECT count(*) FROM outbox_events WHERE type = \(type)")
    }

    private func metric(_ broker: TestBroker, _ line: String) throws -> Bool {
        try broker.get("/metrics").bodyText.contains(line)
    }

    // MARK: 1. a consent-revoked older than a later sign-in

    @Test("a consent-revoked delivered late and duplicated, older than a later sign-in, revokes nothing")
    func lateRevocationIsStale() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        let (userID, sub) = try signIn(broker)
        // Apple sends the user's revocation late, and once more with a new jti.
        var faults = FaultSettings()
        faults.notificationURL = broker.baseURL + "/v1/apple/notifications"
        faults.notificationDelayMilliseconds = 3000
        faults.notificationDuplicates = 1
        faults.notificationRetryMilliseconds = 300
        broker.simulator.faults = faults
        let revokedAt = Date()
        #expect(broker.simulator.revokeConsent(teamID: TestBroker.teamID, sub: sub, clientID: TestBroker.clientID) == 2)
        // The user signs in again before the notification arrives: a new authorization.
        nextSecond(after: revokedAt)
        _ = try signIn(broker, sub: sub)
        #expect(try broker.count("SELECT count(*) FROM apple_notifications") == 0, "the sign-in came first")
        // The simulator records a delivery when the broker's answer reaches it, a moment after the
        // broker's commit: wait for both, not the rows alone.
        try waitUntil(seconds: 15) {
            try broker.count("SELECT count(*) FROM apple_notifications") == 2
                && broker.simulator.notificationDeliveries.count == 2
        }
        #expect(broker.simulator.notificationDeliveries.map(\.status) == [200, 200])
        #expect(
            try broker.count(
                "SELECT count(*) FROM apple_notifications WHERE event_type = 'consent-revoked' AND outcome = 'stale'")
                == 2)
        #expect(try credentialState(broker, userID) == "authorized")
        // The newest refresh token stays: the one of the sign-in after the revocation, live at Apple.
        let live = try broker.pool.query(
            "SELECT authorized_at FROM apple_tokens WHERE user_id = \(userID) AND revoked_at IS NULL")
        #expect(live.count == 1)
        #expect(try live.first?.decode(Date.self, 0) ?? .distantPast >= revokedAt.addingTimeInterval(-1))
        #expect(try events(broker, "consent.revoked") == 0)
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") == 0)
    }

    // MARK: 2. a revocation newer than a sign-in whose token came late

    @Test("a revocation newer than a sign-in wins, also when the sign-in's token reached the broker late")
    func newerRevocationWins() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        let now = Int(Date().timeIntervalSince1970)
        func notifyRevoked(_ sub: String, at seconds: Int) throws {
            var notification = NotificationRequest(
                url: broker.baseURL + "/v1/apple/notifications", type: "consent-revoked", sub: sub,
                clientID: TestBroker.clientID)
            notification.eventTimeMilliseconds = Int64(seconds) * 1000
            #expect(try broker.simulator.sendNotification(notification).status == 200)
        }
        func tokenLogin(_ sub: String?, issuedAt: Int) throws -> HTTPClientResponse {
            try broker.login([
                "identity_token": try broker.mint {
                    $0.sub = sub
                    $0.issuedAt = issuedAt
                }.idToken
            ])
        }
        let first = try tokenLogin(nil, issuedAt: now - 500)
        let userID = try #require(UUID(uuidString: first.json["user_id"] as? String ?? ""))
        let sub = try broker.pool.query("SELECT sub FROM apple_identities").single().decode(String.self, 0)
        try notifyRevoked(sub, at: now - 400)
        #expect(try credentialState(broker, userID) == "revoked")
        // A token from before the revocation, arriving now, proves nothing after it.
        #expect(try tokenLogin(sub, issuedAt: now - 450).json["code"] as? String == "token_too_old")
        // A sign-in after the revocation whose token reaches the broker five minutes late: restored.
        #expect(try tokenLogin(sub, issuedAt: now - 300).status == 200)
        #expect(try credentialState(broker, userID) == "authorized")
        // Apple's next revocation came after that sign-in (though before its token arrived): it wins.
        try notifyRevoked(sub, at: now - 200)
        #expect(try credentialState(broker, userID) == "revoked")
        #expect(try events(broker, "consent.revoked") == 2)
        #expect(
            try broker.count("SELECT count(*) FROM apple_notifications WHERE outcome = 'applied'") == 2, "neither is stale")
    }

    // MARK: 3. request errors and bursts pause every verdict

    @Test("a rising share of request errors across tokens pauses every verdict, not only when a batch starts with three")
    func intermittentRequestErrorsPauseVerdicts() throws {
        let broker = try TestBroker(roles: [.api, .sweep], extra: Self.sweep)
        var subs: [String] = []
        for _ in 0..<10 { subs.append(try signIn(broker).sub) }
        // One of them changed their password: a real verdict (invalid_grant) waits in the batch.
        #expect(broker.simulator.changePassword(teamID: TestBroker.teamID, sub: subs[0]) == 1)
        // One of two egress proxies rewrites bodies: about half the calls, whatever the token
        // (seed 6: the first call passes, then six of ten fail).
        var faults = FaultSettings()
        faults.requestErrorRate = 0.5
        faults.requestErrorSeed = 6
        broker.simulator.faults = faults
        try broker.pool.query("UPDATE apple_tokens SET next_validation_at = now()")
        try waitUntil(seconds: 15) { try metric(broker, "\nrefresh_sweep_breaker_open 1") }
        #expect(try metric(broker, "\nrefresh_sweep_breaker_open 1"))
        #expect(try metric(broker, #"refresh_sweep_breaker_trips_total{error="request_error_share"} 1"#))
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE revoked_at IS NOT NULL") == 0, "no verdict applied")
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") == 0)
        #expect(try events(broker, "token.invalidated") + events(broker, "consent.revoked") == 0)
    }

    @Test("a burst of identical answers worded as a revocation, across many users, trips the breaker: no one is revoked")
    func revokedBurstTripsBreaker() throws {
        let broker = try TestBroker(roles: [.api, .sweep], extra: Self.sweep)
        for _ in 0..<6 { _ = try signIn(broker) }
        // Something between the broker and Apple answers every refresh with Apple's revocation words.
        var faults = FaultSettings()
        faults.forceInvalidGrant = true
        faults.revokedGrantError = "invalid_request"
        broker.simulator.faults = faults
        try broker.pool.query("UPDATE apple_tokens SET next_validation_at = now()")
        try waitUntil(seconds: 15) { try metric(broker, "\nrefresh_sweep_breaker_open 1") }
        #expect(try metric(broker, #"refresh_sweep_breaker_trips_total{error="revoked_burst"} 1"#))
        #expect(try metric(broker, #"refresh_token_validations_total{outcome="verdict_paused"} 6"#))
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") == 0)
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE revoked_at IS NULL") == 6)
        #expect(try events(broker, "consent.revoked") == 0)
        // The verdicts are put back, due again once the pause is over.
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE next_validation_at <= now()") == 6)
    }

    // MARK: 4. a sweep verdict on an old token

    @Test("a sweep verdict on an old token leaves a newer one of the group alive, and the consent as it is")
    func oldTokenVerdictEndsThatTokenOnly() throws {
        let broker = try TestBroker(roles: [.api, .sweep], extra: Self.sweep.merging(Self.grouped) { $1 })
        broker.simulator.setAppGroups([[TestBroker.clientID, TestBroker.webClientID]])
        // The user revoked the app and signed in again on the web (the notification never came):
        // the app's old token is revoked at Apple, the web token of the later sign-in is live.
        let (userID, sub) = try signIn(broker)
        let revokedAt = Date()
        broker.simulator.revokeConsent(teamID: TestBroker.teamID, sub: sub, clientID: TestBroker.clientID)
        // A second later at least than the old token's authorization (an `iat` has whole seconds).
        nextSecond(after: revokedAt.addingTimeInterval(1))
        _ = try signIn(broker, sub: sub, clientID: TestBroker.webClientID)
        // Another user signed in again without a code after the revocation (no newer token).
        let (otherID, otherSub) = try signIn(broker)
        let otherRevokedAt = Date()
        broker.simulator.revokeConsent(teamID: TestBroker.teamID, sub: otherSub, clientID: TestBroker.clientID)
        nextSecond(after: otherRevokedAt.addingTimeInterval(1))
        #expect(try broker.login(["identity_token": try broker.mint { $0.sub = otherSub }.idToken]).status == 200)

        var faults = FaultSettings()
        faults.revokedGrantError = "invalid_request"  // Apple's words: "The user has revoked authorization"
        broker.simulator.faults = faults
        try broker.pool.query("UPDATE apple_tokens SET next_validation_at = now() WHERE client_id = \(TestBroker.clientID)")
        try waitUntil(seconds: 15) {
            try broker.count("SELECT count(*) FROM apple_tokens WHERE revoked_reason = 'token_invalid'") == 2
        }
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") == 0, "the consents stay")
        #expect(try events(broker, "consent.revoked") == 0)
        #expect(
            try broker.count(
                "SELECT count(*) FROM apple_tokens WHERE user_id = \(userID) AND client_id = \(TestBroker.webClientID) AND revoked_at IS NULL"
            ) == 1, "the newer token of the group is alive")
        #expect(try credentialState(broker, userID) == "authorized")
        #expect(try credentialState(broker, otherID) == "token_invalid", "signed in, but no live token to check")
        #expect(try metric(broker, #"refresh_token_validations_total{outcome="superseded"} 2"#))
        let payload = try broker.pool.query("SELECT payload::text FROM outbox_events WHERE type = 'token.invalidated' LIMIT 1")
            .single().decode(String.self, 0)
        #expect(payload.contains(#""signed_in_since": "20"#), "\(payload)")
    }

    // MARK: 7. the code-exchange budget never refuses; names on every path without an exchange

    @Test("a first authorization's name is kept when Apple cannot exchange the code (the answer is lost)")
    func nameKeptWithoutExchange() throws {
        let broker = try TestBroker()
        let minted = try broker.mint { $0.withCode = true }
        broker.setFaults(on: ["token"]) {
            $0.errorRate = 1
            $0.errorStatuses = [503]
        }
        let failed = try broker.login([
            "identity_token": minted.idToken, "authorization_code": minted.code!,
            "user": ["name": ["firstName": "Grace", "lastName": "Hopper"], "email": "grace@example.com"],
        ])
        #expect(failed.status == 503, "\(failed.bodyText)")
        let identity = try broker.pool.query("SELECT given_name, family_name, unverified_email FROM apple_identities").single()
        #expect(try identity.decode(String?.self, "given_name") == "Grace")
        #expect(try identity.decode(String?.self, "family_name") == "Hopper")
        #expect(try identity.decode(String?.self, "unverified_email") == "grace@example.com")
        // Apple will not send the name again; the next sign-in finds it.
        broker.simulator.faults = FaultSettings()
        let again = try broker.login(["identity_token": try broker.mint { $0.sub = minted.sub }.idToken])
        #expect(again.status == 200)
        #expect(again.json["code_exchange"] as? String == "none")
    }

    // MARK: 11. the user field after a missed revocation

    @Test("a re-authorization's user field is kept also after a revocation the broker missed")
    func userFieldAfterMissedRevocation() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        let minted = try broker.mint { $0.withCode = true }
        let first = try broker.login([
            "identity_token": minted.idToken, "authorization_code": minted.code!,
            "user": ["name": ["firstName": "Jane", "lastName": "Doe"]],
        ])
        let userID = try #require(first.json["user_id"] as? String)
        // The user stops using Sign in with Apple; its notification never reaches the broker.
        broker.simulator.revokeConsent(teamID: TestBroker.teamID, sub: minted.sub)
        // Their next sign-in is a first authorization: Apple sends the user field again.
        let again = try broker.mint {
            $0.sub = minted.sub
            $0.withCode = true
        }
        let login = try broker.login([
            "identity_token": again.idToken, "authorization_code": again.code!,
            "user": ["name": ["firstName": "Janet", "lastName": "Roe"], "email": "janet@work.example"],
        ])
        #expect(login.status == 200, "\(login.bodyText)")
        #expect(login.json["unverified_email"] as? String == "janet@work.example")
        let identity = try #require(
            (try broker.get("/v1/users/\(userID)", key: broker.key([.read])).json["identities"] as? [[String: Any]])?.first)
        #expect(identity["given_name"] as? String == "Janet")
        #expect(identity["family_name"] as? String == "Roe")
        #expect(identity["unverified_email"] as? String == "janet@work.example")
        #expect(identity["email"] as? String == minted.email, "the verified address stays the token's")
    }

    // MARK: 13. org_id

    @Test("org_id is cleared when the account's token stops carrying it (the organisation released it)")
    func orgIDCleared() throws {
        let broker = try TestBroker()
        let minted = try broker.mint { $0.managedAccount = true }
        #expect(try broker.login(["identity_token": minted.idToken]).status == 200)
        #expect(try broker.count("SELECT count(*) FROM apple_identities WHERE org_id IS NOT NULL") == 1)
        broker.simulator.setOrganization(teamID: TestBroker.teamID, sub: minted.sub, orgID: nil)
        #expect(try broker.login(["identity_token": try broker.mint { $0.sub = minted.sub }.idToken]).status == 200)
        #expect(try broker.count("SELECT count(*) FROM apple_identities WHERE org_id IS NOT NULL") == 0)
    }
}
