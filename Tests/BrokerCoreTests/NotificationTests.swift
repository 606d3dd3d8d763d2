import AppleSimulator
import BrokerAPI
import BrokerCore
import BrokerCrypto
import EmbeddedPostgres
import Foundation
import HTTPClient
import JOSE
import PostgresClient
import StrictJSON
import TestSupport
import Testing

/// Apple's server-to-server notifications, signed and posted by the simulator over HTTP.
@Suite("Notifications", .offPool)
struct NotificationTests {
    /// A broker with one signed-in user; returns the user's id and sub.
    private func brokerWithUser(_ broker: TestBroker) throws -> (userID: UUID, sub: String) {
        let minted = try broker.mint { $0.withCode = true }
        let response = try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!])
        #expect(response.status == 200)
        return (UUID(uuidString: response.json["user_id"] as! String)!, minted.sub)
    }

    private func notify(
        _ broker: TestBroker, _ type: String, sub: String, configure: (inout NotificationRequest) -> Void = { _ in }
    )
        throws -> NotificationResult
    {
        var request = NotificationRequest(
            url: broker.baseURL + "/v1/apple/notifications", type: type, sub: sub, clientID: TestBroker.clientID)
        configure(&request)
        return try broker.simulator.sendNotification(request)
    }

    private func identity(_ broker: TestBroker, _ sub: String) throws -> PostgresRow {
        // No grant row: the defaults (forwarding enabled, consent active).
        try broker.pool.query(
            """
            SELECT COALESCE(g.email_forwarding, 'enabled'), COALESCE(g.consent, 'active')
            FROM apple_identities i LEFT JOIN apple_grants g ON g.identity_id = i.id AND g.app_id = \(TestBroker.clientID)
            WHERE i.sub = \(sub)
            """
        ).single()
    }

    private func events(_ broker: TestBroker, _ type: String) throws -> Int {
        try broker.count("SELECT count(*) FROM outbox_events WHERE type = \(type)")
    }

    @Test("email-disabled and email-enabled switch relay forwarding and write their events")
    func emailForwarding() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        let (_, sub) = try brokerWithUser(broker)
        #expect(
            try notify(broker, "email-disabled", sub: sub) {
                $0.isPrivateEmail = true
                $0.email = "x@privaterelay.appleid.com"
            }.status == 200)
        #expect(try identity(broker, sub).decode(String.self, 0) == "disabled")
        #expect(try events(broker, "email.forwarding_disabled") == 1)
        // event_time in seconds (Apple's documentation sample) is read as well.
        #expect(
            try notify(broker, "email-enabled", sub: sub) {
                $0.eventTimeInSeconds = true
                $0.eventTimeMilliseconds = Int64(Date().timeIntervalSince1970 + 5) * 1000
            }.status == 200)
        #expect(try identity(broker, sub).decode(String.self, 0) == "enabled")
        #expect(try events(broker, "email.forwarding_enabled") == 1)
        let payload = try broker.pool.query("SELECT payload::text FROM outbox_events WHERE type = 'email.forwarding_disabled'")
            .single()
        #expect(!(try payload.decode(String.self, 0)).contains("@"), "events carry no e-mail address")
    }

    @Test("consent-revoked revokes consent and deletes the refresh token but keeps the user; a later sign-in re-activates")
    func consentRevoked() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        let (userID, sub) = try brokerWithUser(broker)
        #expect(try broker.count("SELECT count(*) FROM apple_tokens") == 1)
        let result = try notify(broker, "consent-revoked", sub: sub) { $0.eventsAsObject = true }
        #expect(result.status == 200)
        #expect(try identity(broker, sub).decode(String.self, 1) == "revoked")
        #expect(try broker.count("SELECT count(*) FROM apple_tokens") == 0)
        #expect(try broker.count("SELECT count(*) FROM users WHERE id = \(userID)") == 1)
        #expect(try events(broker, "consent.revoked") == 1)
        let again = try broker.login(["identity_token": try broker.mint { $0.sub = sub }.idToken])
        #expect(again.json["user_id"] as? String == userID.lowercasedString)
        #expect(try identity(broker, sub).decode(String.self, 1) == "active")
    }

    @Test("account-delete and account-deleted open a deletion request from Apple")
    func accountDelete() throws {
        // Without the deletion role, so the request stays open for us to look at (the deletion
        // job would otherwise purge the user at once; DeletionTests cover that part).
        let broker = try TestBroker(roles: [.api, .notifications])
        let (userID, sub) = try brokerWithUser(broker)
        #expect(try notify(broker, "account-delete", sub: sub).status == 200)
        let request = try broker.pool.query("SELECT source, state FROM deletion_requests WHERE user_id = \(userID)").single()
        #expect(try request.decode(String.self, 0) == "apple")
        #expect(try events(broker, "user.deletion_requested") == 1)
        #expect(
            try broker.pool.query("SELECT status FROM users WHERE id = \(userID)").single().decode(String.self, 0) == "deleting")
        // The documented spelling on another user.
        let (otherID, otherSub) = try brokerWithUser(broker)
        #expect(try notify(broker, "account-deleted", sub: otherSub).status == 200)
        #expect(try broker.count("SELECT count(*) FROM deletion_requests WHERE user_id = \(otherID) AND source = 'apple'") == 1)
        // A second account-delete for the first user: one open request still.
        #expect(try notify(broker, "account-delete", sub: sub).status == 200)
        #expect(try broker.count("SELECT count(*) FROM deletion_requests WHERE user_id = \(userID)") == 1)
    }

    @Test(
        "the same notification posted five times at once is applied once; unknown subjects and types are stored and answered 200")
    func duplicatesAndUnknowns() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        let (_, sub) = try brokerWithUser(broker)
        var request = NotificationRequest(
            url: broker.baseURL + "/v1/apple/notifications", type: "email-disabled", sub: sub, clientID: TestBroker.clientID)
        let (jti, payload) = try broker.simulator.signNotification(request)
        let body = String(decoding: JSONValue.object(["payload": .string(payload)]).serialized(), as: UTF8.self)
        let responses = try onThreads(5) { _ in try broker.post("/v1/apple/notifications", json: body) }.map { try $0.get() }
        #expect(responses.allSatisfy { $0.status == 200 })
        #expect(responses.filter { $0.json["status"] as? String == "applied" }.count == 1)
        #expect(responses.filter { $0.json["status"] as? String == "duplicate" }.count == 4)
        #expect(try events(broker, "email.forwarding_disabled") == 1)
        #expect(try broker.count("SELECT count(*) FROM apple_notifications WHERE jti = \(jti)") == 1)

        request.sub = "001234.unknown.0000"
        #expect(try broker.simulator.sendNotification(request).status == 200)
        request.sub = sub
        request.type = "future-event-type"
        #expect(try broker.simulator.sendNotification(request).status == 200)
        let outcomes = try broker.pool.query("SELECT outcome FROM apple_notifications ORDER BY outcome").map {
            try $0.decode(String.self, 0)
        }
        #expect(outcomes == ["applied", "unknown_subject", "unknown_type"])
        // The audit log names the subject by hash only.
        #expect(
            try broker.count("SELECT count(*) FROM audit_log WHERE detail::text LIKE \("%" + sub + "%") OR subject = \(sub)") == 0
        )
    }

    @Test("the inbox keeps notifications for BROKER_NOTIFICATION_RETENTION_SECONDS; one older than that is stale, not applied")
    func inboxRetention() throws {
        let broker = try TestBroker(roles: [.api, .notifications], extra: ["BROKER_NOTIFICATION_RETENTION_SECONDS": "86400"])
        let (_, sub) = try brokerWithUser(broker)
        let old = Int64(Date().timeIntervalSince1970 - 2 * 86_400) * 1000
        var request = NotificationRequest(
            url: broker.baseURL + "/v1/apple/notifications", type: "email-disabled", sub: sub, clientID: TestBroker.clientID)
        request.eventTimeMilliseconds = old
        let (_, payload) = try broker.simulator.signNotification(request)
        let late = try broker.post(
            "/v1/apple/notifications",
            json: String(decoding: JSONValue.object(["payload": .string(payload)]).serialized(), as: UTF8.self))
        #expect(late.status == 200)
        #expect(late.json["status"] as? String == "stale")
        #expect(try identity(broker, sub).decode(String.self, 0) == "enabled")
        #expect(try notify(broker, "email-disabled", sub: sub).status == 200)
        #expect(try broker.count("SELECT count(*) FROM apple_notifications") == 1)
        try broker.pool.query("UPDATE apple_notifications SET received_at = now() - interval '25 hours'")
        try NotificationReceiver.prune(broker.pool, retention: .seconds(86_400))
        #expect(try broker.count("SELECT count(*) FROM apple_notifications") == 0)
    }

    @Test("an older event arriving late does not overwrite a newer state")
    func outOfOrder() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        let (_, sub) = try brokerWithUser(broker)
        let base = Int64(Date().timeIntervalSince1970 * 1000)
        #expect(try notify(broker, "email-enabled", sub: sub) { $0.eventTimeMilliseconds = base + 2000 }.status == 200)
        let late = try broker.simulator.sendNotification(
            {
                var request = NotificationRequest(
                    url: broker.baseURL + "/v1/apple/notifications", type: "email-disabled", sub: sub,
                    clientID: TestBroker.clientID)
                request.eventTimeMilliseconds = base + 1000
                return request
            }())
        #expect(late.status == 200)
        #expect(try identity(broker, sub).decode(String.self, 0) == "enabled")
        #expect(try broker.count("SELECT count(*) FROM apple_notifications WHERE outcome = 'stale'") == 1)
        // And the reverse order for another pair ends disabled.
        #expect(try notify(broker, "email-disabled", sub: sub) { $0.eventTimeMilliseconds = base + 4000 }.status == 200)
        #expect(try notify(broker, "email-enabled", sub: sub) { $0.eventTimeMilliseconds = base + 3000 }.status == 200)
        #expect(try identity(broker, sub).decode(String.self, 0) == "disabled")
    }

    @Test("forged or malformed payloads are 4xx and change nothing")
    func forgeries() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        let (_, sub) = try brokerWithUser(broker)
        let before = try broker.count("SELECT count(*) FROM outbox_events")
        let now = Int64(Date().timeIntervalSince1970)
        let events = #"{"type":"consent-revoked","sub":"\#(sub)","event_time":\#(now * 1000)}"#
        let good: [String: JSONValue] = [
            "iss": "https://appleid.apple.com", "aud": .string(TestBroker.clientID), "iat": .integer(now),
            "exp": .integer(now + 3600), "jti": .string(UUID().uuidString), "events": .string(events),
        ]
        func post(_ payload: String) throws -> Int {
            try broker.post(
                "/v1/apple/notifications",
                json: String(decoding: JSONValue.object(["payload": .string(payload)]).serialized(), as: UTF8.self)
            ).status
        }
        func signed(_ change: (inout [String: JSONValue]) -> Void) throws -> String {
            var claims = good
            claims["jti"] = .string(UUID().uuidString)
            change(&claims)
            return try broker.simulator.signClaims(claims)
        }
        let body = Array(String(decoding: JSONValue.object(good).serialized(), as: UTF8.self).utf8)
        let appleKid = broker.simulator.currentKeyID
        func forge(_ header: String, _ sign: (String) throws -> [UInt8]) throws -> String {
            let input: String = Base64URL.encode(header) + "." + Base64URL.encode(body)
            return input + "." + Base64URL.encode(try sign(input))
        }
        let foreign = try AsymmetricKey.generateRSA()
        let publicPEM = Array(try broker.simulator.keySet.verificationKey(keyID: appleKid)!.key.publicKeyPEM().utf8)
        let cases: [(String, Int)] = [
            (try forge("{\"alg\":\"RS256\",\"kid\":\"\(appleKid)\"}") { try foreign.signSHA256(Array($0.utf8)) }, 401),
            (try forge("{\"alg\":\"none\",\"kid\":\"\(appleKid)\"}") { _ in [] }, 401),
            (
                try forge("{\"alg\":\"HS256\",\"kid\":\"\(appleKid)\"}") {
                    HMACSHA256.authenticate(Array($0.utf8), key: publicPEM)
                }, 401
            ),
            (try signed { $0["aud"] = "com.attacker.app" }, 401),
            (try signed { $0["iss"] = "https://evil.example" }, 401),
            (try signed { $0["iat"] = .integer(now + 3600) }, 401),
            (try signed { $0["exp"] = .integer(now - 3600) }, 401),
            (try signed { $0["jti"] = nil }, 401),
            (try signed { $0["events"] = nil }, 400),
            (try signed { $0["events"] = "not json" }, 400),
            (try signed { $0["events"] = .string(#"{"type":"consent-revoked","event_time":1}"#) }, 400),
            ("not-a-jws", 401),
        ]
        for (index, (payload, status)) in cases.enumerated() {
            #expect(try post(payload) == status, "case \(index)")
        }
        #expect(try broker.post("/v1/apple/notifications", json: #"{"payload":5}"#).status == 400)
        #expect(try broker.post("/v1/apple/notifications", json: #"{"other":"x"}"#).status == 400)
        #expect(try broker.post("/v1/apple/notifications", json: "[]").status == 400)
        let oversized = #"{"payload":""# + String(repeating: "a", count: 70_000) + #""}"#
        #expect(try broker.post("/v1/apple/notifications", json: oversized).status == 413)

        #expect(try broker.count("SELECT count(*) FROM outbox_events") == before)
        #expect(try broker.count("SELECT count(*) FROM apple_notifications") == 0)
        #expect(try identity(broker, sub).decode(String.self, 1) == "active")
        #expect(try broker.get("/metrics").bodyText.contains(#"apple_notifications_total{type="unverified",outcome="rejected"}"#))
    }

    @Test("with PostgreSQL down the answer is 503, and Apple's retry after recovery is applied once")
    func databaseOutage() throws {
        let cluster = try TestPostgres.dedicatedCluster()
        defer { try? cluster.stop() }
        let broker = try TestBroker(database: cluster.connectionConfiguration, roles: [.api, .notifications])
        let (_, sub) = try brokerWithUser(broker)
        let request = NotificationRequest(
            url: broker.baseURL + "/v1/apple/notifications", type: "consent-revoked", sub: sub, clientID: TestBroker.clientID)
        let (_, payload) = try broker.simulator.signNotification(request)
        let body = String(decoding: JSONValue.object(["payload": .string(payload)]).serialized(), as: UTF8.self)

        try cluster.stop()
        let down = try broker.post("/v1/apple/notifications", json: body)
        #expect(down.status == 503)
        #expect(down.header("retry-after") != nil)
        try cluster.start()
        let retried = try broker.post("/v1/apple/notifications", json: body)
        #expect(retried.status == 200)
        #expect(retried.json["status"] as? String == "applied")
        #expect(try broker.post("/v1/apple/notifications", json: body).json["status"] as? String == "duplicate")
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'consent.revoked'") == 1)
    }
}
