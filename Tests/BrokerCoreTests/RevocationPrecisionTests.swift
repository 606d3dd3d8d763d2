import AppleSimulator
import BrokerCore
import BrokerCrypto
import Foundation
import HTTPClient
import PostgresClient
import TestSupport
import Testing

/// Issue 28: no false revocations and no false successes, against a simulator as strict as
/// Apple (protocol reference §11). Each test fails on the code before it.
@Suite("Revocation you can trust", .offPool)
struct RevocationPrecisionTests {
    static let sweep = ["BROKER_SWEEP_INTERVAL_SECONDS": "1", "BROKER_SWEEP_CONCURRENCY": "1"]
    static let fastDeletions = [
        "BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1", "BROKER_DELETION_RETRY_MAX_SECONDS": "1",
    ]

    private func credentialState(_ broker: TestBroker, _ id: UUID) throws -> String? {
        try broker.get("/v1/users/\(id.lowercasedString)/credential-state", key: broker.key([.read])).json["state"] as? String
    }

    /// Logs in a new user with a code (a refresh token stored).
    private func signedIn(_ broker: TestBroker) throws -> (id: UUID, sub: String) {
        let minted = try broker.mint { $0.withCode = true }
        let login = try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!])
        #expect(login.status == 200, "\(login.bodyText)")
        return (try #require(UUID(uuidString: login.json["user_id"] as? String ?? "")), minted.sub)
    }

    private func metric(_ broker: TestBroker, _ line: String) throws -> Bool {
        try broker.get("/metrics").bodyText.contains(line)
    }

    // MARK: 1. invalid_request on a refresh

    @Test("an invalid_request that does not say revoked (a request defect, TN3107) revokes nothing; many alike trip the breaker")
    func unwordedInvalidRequestRevokesNothing() throws {
        let broker = try TestBroker(
            roles: [.api, .sweep], extra: Self.sweep.merging(["BROKER_SWEEP_BREAKER_SECONDS": "3600"]) { $1 })
        for _ in 0..<5 { _ = try signedIn(broker) }
        var faults = FaultSettings()
        faults.malformedRequest = true
        broker.simulator.faults = faults
        try broker.pool.query("UPDATE apple_tokens SET next_validation_at = now()")
        // (The gauge's HELP text contains "refresh_sweep_breaker_open 1": match the sample line.)
        try waitUntil(seconds: 10) { try metric(broker, "\nrefresh_sweep_breaker_open 1") }
        #expect(try metric(broker, "\nrefresh_sweep_breaker_open 1"))
        #expect(try metric(broker, #"refresh_sweep_breaker_trips_total{error="invalid_request"} 1"#))
        #expect(try metric(broker, #"refresh_token_validations_total{outcome="request_error"} 3"#))
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") == 0, "no mass revocation")
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE revoked_at IS NULL") == 5)
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'consent.revoked'") == 0)
    }

    @Test(
        "an unworded invalid_request repeated on one token, while other tokens refresh fine, ends that token only: never the consent"
    )
    func tokenSpecificInvalidRequestRepeats() throws {
        let broker = try TestBroker(roles: [.api, .sweep], extra: Self.sweep)
        let (victim, victimSub) = try signedIn(broker)
        let (fine, _) = try signedIn(broker)
        var faults = FaultSettings()
        faults.malformedRequestSubs = [victimSub]
        broker.simulator.faults = faults
        try broker.pool.query("UPDATE apple_tokens SET next_validation_at = now()")
        try waitUntil(seconds: 10) {
            try broker.count("SELECT count(*) FROM apple_tokens WHERE last_validation_error = 'invalid_request'") == 1
        }
        try waitUntil(seconds: 10) {
            try broker.count("SELECT count(*) FROM apple_tokens WHERE last_validated_at IS NOT NULL") == 1
        }
        #expect(try credentialState(broker, victim) == "authorized", "one invalid_request is no verdict")
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") == 0)
        // Later: the victim's refresh is refused again while the other token refreshes. Without
        // Apple's words it decides no consent (protocol reference §12.2): at most the token is dead.
        try broker.pool.query("UPDATE apple_tokens SET next_validation_at = now()")
        try waitUntil(seconds: 10) { try credentialState(broker, victim) == "token_invalid" }
        #expect(try credentialState(broker, victim) == "token_invalid")
        #expect(try credentialState(broker, fine) == "authorized")
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") == 0)
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'consent.revoked'") == 0)
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'token.invalidated'") == 1)
        #expect(try metric(broker, #"refresh_token_validations_total{outcome="token_invalid_repeated_request_error"} 1"#))
    }

    // MARK: 2. invalid_request on /auth/revoke

    @Test("invalid_request on /auth/revoke is an error of the step, retried, never already_invalid")
    func revokeInvalidRequestIsNoSuccess() throws {
        let broker = try TestBroker(roles: [.api, .deletion], extra: Self.fastDeletions)
        let (userID, sub) = try signedIn(broker)
        var faults = FaultSettings()
        faults.malformedRequest = true
        faults.endpoints = ["revoke"]
        broker.simulator.faults = faults
        let answer = try broker.post(
            "/v1/deletions", json: #"{"user_id":"\#(userID.lowercasedString)","reason":"test","requested_by":"test"}"#,
            key: broker.key([.compliance]))
        #expect(answer.status == 202, "\(answer.bodyText)")
        try waitUntil(seconds: 10) {
            try broker.count("SELECT count(*) FROM deletion_steps WHERE step = 'revoke' AND outcome = 'request_error'") >= 2
        }
        #expect(try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 0, "not done on a 400")
        #expect(try broker.count("SELECT count(*) FROM deletion_steps WHERE outcome = 'already_invalid'") == 0)
        #expect(broker.simulator.isTokenValid(try #require(liveRefreshToken(broker, sub: sub))), "the grant is live at Apple")
        // Once the request is right again, the grant is revoked for real.
        broker.simulator.faults = FaultSettings()
        try waitUntil(seconds: 20) { try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 1 }
        let revocation = try broker.pool.query("SELECT apple_revocation FROM deletion_requests").single().decode(String?.self, 0)
        #expect(revocation == "revoked")
    }

    /// The simulator's refresh token of a user (the broker holds it encrypted).
    private func liveRefreshToken(_ broker: TestBroker, sub: String) -> String? {
        broker.simulator.refreshTokens(sub: sub).first
    }

    // MARK: 3. invalid_grant on a refresh

    @Test(
        "a password change kills the refresh token, not the consent: token_invalid, no consent.revoked, deletion manual_required")
    func passwordChangeKeepsConsent() throws {
        let broker = try TestBroker(roles: [.api, .deletion, .sweep], extra: Self.sweep.merging(Self.fastDeletions) { $1 })
        let (userID, sub) = try signedIn(broker)
        #expect(broker.simulator.changePassword(teamID: TestBroker.teamID, sub: sub) == 1)
        try broker.pool.query("UPDATE apple_tokens SET next_validation_at = now()")
        try waitUntil(seconds: 10) { try credentialState(broker, userID) == "token_invalid" }
        #expect(try credentialState(broker, userID) == "token_invalid")
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") == 0, "the consent stays")
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'consent.revoked'") == 0)
        let event = try broker.pool.query("SELECT payload::text FROM outbox_events WHERE type = 'token.invalidated'").single()
        #expect(try event.decode(String.self, 0).contains(#""action": "sign_in_again""#))
        #expect(try metric(broker, #"refresh_token_validations_total{outcome="token_invalid"} 1"#))
        let user = try broker.get("/v1/users/\(userID.lowercasedString)", key: broker.key([.read])).json
        let identity = (user["identities"] as? [[String: Any]])?.first
        #expect(identity?["consent"] as? String == "active")

        // A fresh sign-in stores a new token: authorized again.
        let again = try broker.mint {
            $0.sub = sub
            $0.withCode = true
        }
        #expect(try broker.login(["identity_token": again.idToken, "authorization_code": again.code!]).status == 200)
        #expect(try credentialState(broker, userID) == "authorized")

        // Dead again, then deleted: nothing live to revoke, so manual_required.
        broker.simulator.changePassword(teamID: TestBroker.teamID, sub: sub)
        try broker.pool.query("UPDATE apple_tokens SET next_validation_at = now(), access_token = NULL")
        try waitUntil(seconds: 10) { try credentialState(broker, userID) == "token_invalid" }
        let deletion = try broker.post(
            "/v1/deletions", json: #"{"user_id":"\#(userID.lowercasedString)","reason":"test","requested_by":"test"}"#,
            key: broker.key([.compliance]))
        #expect(deletion.status == 202)
        try waitUntil(seconds: 20) { try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 1 }
        let revocation = try broker.pool.query("SELECT apple_revocation FROM deletion_requests").single().decode(String?.self, 0)
        #expect(revocation == "manual_required")
    }

    // MARK: 4. a deletion's code is exchanged at once

    @Test("a deletion's fresh code is exchanged in the request, before the queue: no deletion worker needed for it")
    func deletionCodeExchangedAtOnce() throws {
        // This process runs the API only: a queue that is slower than Apple's five minutes.
        let broker = try TestBroker(roles: [.api])
        let minted = try broker.mint()
        let login = try broker.login(["identity_token": minted.idToken])
        let userID = try #require(login.json["user_id"] as? String)
        let code = broker.simulator.issueCode(teamID: TestBroker.teamID, sub: minted.sub, clientID: TestBroker.clientID)
        let before = broker.simulator.statistics.token
        let answer = try broker.post(
            "/v1/deletions",
            json: #"{"user_id":"\#(userID)","reason":"test","requested_by":"test","authorization_code":"\#(code)"}"#,
            key: broker.key([.compliance]))
        #expect(answer.status == 202, "\(answer.bodyText)")
        #expect(broker.simulator.statistics.token - before == 1, "exchanged before the answer")
        #expect(
            try broker.count("SELECT count(*) FROM deletion_steps WHERE step = 'code_exchange' AND outcome = 'exchanged'") == 1)
        #expect(
            try broker.count("SELECT count(*) FROM apple_tokens WHERE revoked_at IS NULL") == 1, "its token waits for the revoke")
        #expect(
            try broker.count("SELECT count(*) FROM deletion_requests WHERE authorization_code IS NOT NULL") == 0, "no code kept")
    }

    // MARK: 5. a token from before a consent-revoked

    @Test("an identity token issued before a consent-revoked never restores the consent; one issued after it does")
    func staleTokenDoesNotRestore() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        let now = Int(Date().timeIntervalSince1970)
        // Signed in three minutes ago, revoked a minute ago (Apple's clock orders them, issue 35).
        let first = try broker.mint { $0.issuedAt = now - 180 }
        let signIn = try broker.login(["identity_token": first.idToken])
        let userID = try #require(UUID(uuidString: signIn.json["user_id"] as? String ?? ""))
        let sub = first.sub
        let stale = try broker.mint {
            $0.sub = sub
            $0.issuedAt = now - 120
        }
        var notification = NotificationRequest(
            url: broker.baseURL + "/v1/apple/notifications", type: "consent-revoked", sub: sub, clientID: TestBroker.clientID)
        notification.eventTimeMilliseconds = Int64(now - 60) * 1000
        let result = try broker.simulator.sendNotification(notification)
        #expect(result.status == 200)
        #expect(try credentialState(broker, userID) == "revoked")
        let refused = try broker.login(["identity_token": stale.idToken])
        #expect(refused.status == 401, "\(refused.bodyText)")
        #expect(refused.json["code"] as? String == "token_too_old")
        #expect(try credentialState(broker, userID) == "revoked")
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'consent.restored'") == 0)
        let fresh = try broker.mint { $0.sub = sub }
        #expect(try broker.login(["identity_token": fresh.idToken]).status == 200)
        #expect(try credentialState(broker, userID) == "authorized")
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'consent.restored'") == 1)
    }

    // MARK: 6. a code goes to Apple once

    @Test("a code whose answer was lost is never sent again: 503 apple_unavailable, then 200 without a token, never 400")
    func codeSentOnce() throws {
        let broker = try TestBroker()
        let minted = try broker.mint { $0.withCode = true }
        // Apple does the work, the answer is lost (timeout_after_work).
        broker.setFaults(on: ["token"]) {
            $0.timeoutRate = 1
            $0.timeoutMilliseconds = 50
        }
        let before = broker.simulator.statistics.token
        let first = try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!])
        #expect(first.status == 503, "\(first.bodyText)")
        #expect(first.json["code"] as? String == "apple_unavailable")
        #expect(broker.simulator.statistics.token - before == 1, "the code went to Apple once")
        broker.simulator.faults = FaultSettings()
        let retry = try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!])
        #expect(retry.status == 200, "\(retry.bodyText)")
        #expect(retry.json["refresh_token_stored"] as? Bool == false)
        #expect(broker.simulator.statistics.token - before == 1, "and never again")
        #expect(try metric(broker, #"login_code_unsendable_total{outcome="spent"} 1"#))
    }

    @Test("Apple's 429 on a login's code exchange is no lost answer: 503 with Retry-After, and a retry exchanges the code")
    func throttledCodeStaysGood() throws {
        let broker = try TestBroker()
        let minted = try broker.mint { $0.withCode = true }
        // Apple throttles /auth/token: it refuses the call before using the code (issue 35, item 10).
        broker.setFaults(on: ["token"]) {
            $0.errorRate = 1
            $0.errorStatuses = [429]
            $0.retryAfterSeconds = 7
        }
        let before = broker.simulator.statistics.token
        let first = try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!])
        #expect(first.status == 503, "\(first.bodyText)")
        #expect(first.json["code"] as? String == "apple_unavailable")
        #expect(first.header("retry-after") == "7", "Apple's own Retry-After reaches the caller")
        #expect(broker.simulator.statistics.token - before == 1)
        broker.simulator.faults = FaultSettings()
        let retry = try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!])
        #expect(retry.status == 200, "\(retry.bodyText)")
        #expect(retry.json["code_exchange"] as? String == "exchanged", "the same code, unused, is exchanged now")
        #expect(retry.json["refresh_token_stored"] as? Bool == true)
        #expect(broker.simulator.statistics.token - before == 2)
        #expect(try !metric(broker, #"login_code_unsendable_total{outcome="spent"}"#))
    }

    // MARK: 10. c_hash

    @Test("a code that is not the identity token's (its c_hash) is 400 without a call to Apple")
    func codeMustMatchCHash() throws {
        let broker = try TestBroker()
        let minted = try broker.mint { $0.withCode = true }
        // A real, unused code of the same user, but not the one issued with this token.
        let other = broker.simulator.issueCode(teamID: TestBroker.teamID, sub: minted.sub, clientID: TestBroker.clientID)
        let before = broker.simulator.statistics.token
        let answer = try broker.login(["identity_token": minted.idToken, "authorization_code": other])
        #expect(answer.status == 400, "\(answer.bodyText)")
        #expect(answer.json["code"] as? String == "authorization_code_invalid")
        #expect(broker.simulator.statistics.token == before, "no call to Apple")
        #expect(try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!]).status == 200)
    }

    // MARK: 7. unknown kids on the public notification endpoint

    @Test("a forged kid posted to the notification endpoint cannot suppress the refetch a login's new kid needs")
    func notificationCannotSpendLoginRefetch() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        #expect(try broker.login(["identity_token": try broker.mint().idToken]).status == 200)  // keys cached
        // Anyone may post: a JWS with a kid Apple never published.
        let input: String = Base64URL.encode(#"{"alg":"RS256","kid":"forged-kid"}"#) + "." + Base64URL.encode(#"{"iss":"x"}"#)
        let forged = input + "." + Base64URL.encode(try AsymmetricKey.generateRSA().signSHA256(Array(input.utf8)))
        let posted = try broker.post("/v1/apple/notifications", json: #"{"payload":"\#(forged)"}"#)
        #expect(posted.status == 401 || posted.status == 400, "\(posted.bodyText)")
        // Apple rotates its key right after; a real login with the new kid must still verify.
        try broker.simulator.rotateKeys()
        let login = try broker.login(["identity_token": try broker.mint().idToken])
        #expect(login.status == 200, "\(login.bodyText)")
    }

    // MARK: 12. email events

    @Test("an email event's email and is_private_email become what the user record shows, with identity.updated")
    func emailEventApplied() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        let (userID, sub) = try signedIn(broker)
        var notification = NotificationRequest(
            url: broker.baseURL + "/v1/apple/notifications", type: "email-enabled", sub: sub, clientID: TestBroker.clientID)
        notification.email = "new9k2@private.icloud.com"
        notification.isPrivateEmail = true
        #expect(try broker.simulator.sendNotification(notification).status == 200)
        let user = try broker.get("/v1/users/\(userID.lowercasedString)", key: broker.key([.read])).json
        let identity = (user["identities"] as? [[String: Any]])?.first
        #expect(identity?["email"] as? String == "new9k2@private.icloud.com")
        #expect(identity?["is_private_email"] as? Bool == true)
        let event = try broker.pool.query("SELECT payload::text FROM outbox_events WHERE type = 'identity.updated'").single()
        #expect(try event.decode(String.self, 0).contains(#""source": "apple""#))
        // The one statement records the app it was for.
        #expect(try broker.count("SELECT count(*) FROM apple_notifications WHERE client_id = \(TestBroker.clientID)") == 1)

        // An email event older than the last verified sign-in (by more than the second's grace)
        // changes the forwarding it is about but not the address the sign-in verified.
        try broker.pool.query("UPDATE apple_identities SET last_verified_at = now() WHERE sub = \(sub)")
        var older = NotificationRequest(
            url: broker.baseURL + "/v1/apple/notifications", type: "email-disabled", sub: sub, clientID: TestBroker.clientID)
        older.email = "old7q1@private.icloud.com"
        older.isPrivateEmail = true
        older.eventTimeMilliseconds = Int64(Date().timeIntervalSince1970 - 60) * 1000
        #expect(try broker.simulator.sendNotification(older).status == 200)
        let after = try broker.get("/v1/users/\(userID.lowercasedString)", key: broker.key([.read])).json
        #expect((after["identities"] as? [[String: Any]])?.first?["email"] as? String == "new9k2@private.icloud.com")
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'identity.updated'") == 1)
    }

    @Test("a sign-in after a revocation is a first authorization again: the user field's name is kept over the old one")
    func reauthorizationKeepsUserField() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        let minted = try broker.mint { $0.issuedAt = Int(Date().timeIntervalSince1970) - 60 }
        let first = try broker.login([
            "identity_token": minted.idToken, "user": ["name": ["firstName": "Jane", "lastName": "Doe"]],
        ])
        let userID = try #require(UUID(uuidString: first.json["user_id"] as? String ?? ""))
        var notification = NotificationRequest(
            url: broker.baseURL + "/v1/apple/notifications", type: "consent-revoked", sub: minted.sub,
            clientID: TestBroker.clientID)
        notification.eventTimeMilliseconds = Int64(Date().timeIntervalSince1970 - 5) * 1000
        #expect(try broker.simulator.sendNotification(notification).status == 200)
        let again = try broker.mint { $0.sub = minted.sub }
        let login = try broker.login([
            "identity_token": again.idToken, "user": ["name": ["firstName": "Janet", "lastName": "Roe"]],
        ])
        #expect(login.status == 200, "\(login.bodyText)")
        let user = try broker.get("/v1/users/\(userID.lowercasedString)", key: broker.key([.read])).json
        let identity = (user["identities"] as? [[String: Any]])?.first
        #expect(identity?["given_name"] as? String == "Janet")
        #expect(identity?["family_name"] as? String == "Roe")
        // Apple sends the field on a first authorization only: whenever it comes, it is one (issue
        // 35), also when the broker missed the revocation before it. It replaces the name.
        let third = try broker.mint { $0.sub = minted.sub }
        _ = try broker.login(["identity_token": third.idToken, "user": ["name": ["firstName": "Mallory"]]])
        let after = try broker.get("/v1/users/\(userID.lowercasedString)", key: broker.key([.read])).json
        #expect(((after["identities"] as? [[String: Any]])?.first?["given_name"] as? String) == "Mallory")
        #expect(((after["identities"] as? [[String: Any]])?.first?["family_name"] as? String) == "Roe", "kept when not sent")
    }

    // MARK: 8. Retry-After

    @Test("Apple's Retry-After reaches the caller, as seconds or an HTTP-date, not capped at 2 s")
    func retryAfterPassedOn() throws {
        let broker = try TestBroker()
        let minted = try broker.mint { $0.withCode = true }
        broker.setFaults(on: ["token"]) {
            $0.errorRate = 1
            $0.errorStatuses = [503]
            $0.retryAfterSeconds = 120
        }
        let before = broker.simulator.statistics.token
        let answer = try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!])
        #expect(answer.status == 503)
        #expect(answer.header("retry-after") == "120")
        #expect(broker.simulator.statistics.token - before == 1)
        // The same as an HTTP-date.
        broker.simulator.faults.retryAfterAsDate = true
        let dated = try broker.mint { $0.withCode = true }
        let second = try broker.login(["identity_token": dated.idToken, "authorization_code": dated.code!])
        #expect(second.status == 503)
        let seconds = Int(second.header("retry-after") ?? "") ?? 0
        #expect(seconds >= 110 && seconds <= 121, "Retry-After \(seconds)")
    }

    // MARK: 9. the first validation follows the setting

    @Test("the first refresh-token validation after a login follows BROKER_REFRESH_VALIDATION_SECONDS")
    func firstValidationFollowsSetting() throws {
        let broker = try TestBroker(extra: ["BROKER_REFRESH_VALIDATION_SECONDS": "3000"])
        _ = try signedIn(broker)
        let seconds = try broker.count("SELECT EXTRACT(EPOCH FROM next_validation_at - now())::int FROM apple_tokens")
        #expect(seconds >= 2990 && seconds <= 3310, "\(seconds) s")
    }
}

extension TestBroker {
    /// Sets the simulator's faults, limited to these endpoints; returns them.
    @discardableResult
    func setFaults(on endpoints: [String], _ configure: (inout FaultSettings) -> Void) -> FaultSettings {
        var faults = FaultSettings()
        faults.endpoints = endpoints
        configure(&faults)
        simulator.faults = faults
        return faults
    }
}
