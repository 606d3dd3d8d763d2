import AppleSimulator
import BrokerAPI
import BrokerCrypto
import Foundation
import HTTPClient
import PostgresClient
import TestSupport
import Testing

@testable import BrokerCore

/// Retiring a `TOKEN_ENCRYPTION_KEY`: prepend a new key, `appleid-broker reencrypt`, then run
/// with the new key alone; everything sealed before must still work.
@Suite("Encryption key rotation", .offPool)
struct KeyRotationTests {
    @Test("rotate, re-encrypt, restart with the new key alone: refresh tokens revoke at deletion, webhook secrets sign")
    func rotateAndRetire() throws {
        let database = try TestPostgres.freshDatabase()
        let old = "k1:" + Data(SecureRandom.bytes(32)).base64EncodedString()
        let new = "k2:" + Data(SecureRandom.bytes(32)).base64EncodedString()
        // The first broker serves the API only, so no job of its own touches the deletion below.
        let first = try TestBroker(database: database, roles: [.api], extra: ["TOKEN_ENCRYPTION_KEY": old])
        let (userID, sub) = try first.signIn(clients: [TestBroker.clientID, TestBroker.webClientID])
        let subscription = try first.post(
            "/v1/webhook-subscriptions", json: #"{"url":"https://hooks.example.com/in","topics":["*"]}"#, key: first.key([.admin])
        )
        #expect(subscription.status == 201)
        let webhookSecret = try #require(subscription.json["secret"] as? String)
        #expect(try first.count("SELECT count(*) FROM apple_tokens WHERE key_id = 'k1' AND access_key_id = 'k1'") == 2)

        var environment = first.environment
        environment["TOKEN_ENCRYPTION_KEY"] = new + "," + old
        let run = try BrokerExecutable.run(["reencrypt", "--batch", "1"], environment: environment)
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.stdout.contains("refresh_tokens resealed=2 unreadable=0 remaining=0"), "\(run.stdout)")
        #expect(run.stdout.contains("access_tokens resealed=2 unreadable=0 remaining=0"))
        #expect(run.stdout.contains("webhook_secrets resealed=1 unreadable=0 remaining=0"))
        #expect(run.stderr.contains("'k1' can now be removed"))
        let again = try BrokerExecutable.run(["reencrypt"], environment: environment)
        #expect(again.status == 0)
        #expect(again.stdout.contains("refresh_tokens resealed=0"), "resumable: nothing left to do")
        #expect(try first.count("SELECT count(*) FROM apple_tokens WHERE key_id <> 'k2' OR access_key_id <> 'k2'") == 0)

        // The old key alone can no longer open anything; the new key alone opens everything.
        let retired = try TokenKeyRing(parsing: new)
        let id = UUID(uuidString: try #require(subscription.json["id"] as? String))!
        let stored = try first.pool.query("SELECT secret, key_id FROM webhook_subscriptions").single()
        let opened = try WebhookSubscriptionStore(pool: first.pool, tokenKeys: retired)
            .secret(sealed: try stored.decode([UInt8].self, 0), keyID: try stored.decode(String.self, 1), subscriptionID: id)
        #expect("whsec_" + Data(opened).base64EncodedString() == webhookSecret)

        let second = try TestBroker(
            database: database, roles: [.api, .deletion],
            extra: [
                "TOKEN_ENCRYPTION_KEY": new, "BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1",
                // The same Apple credentials as before: the first broker's simulator knows them.
                "APPLE_PRIVATE_KEY_PATH": first.environment["APPLE_PRIVATE_KEY_PATH"]!,
                "APPLE_KEY_ID": first.environment["APPLE_KEY_ID"]!,
            ],
            appleBaseURL: first.simulator.baseURL)
        let body = #"{"user_id":"\#(userID.lowercasedString)","reason":"rotation test","requested_by":"test"}"#
        #expect(try second.post("/v1/deletions", json: body, key: second.key([.compliance])).status == 202)
        try waitUntil(seconds: 30) {
            try second.count("SELECT count(*) FROM deletion_requests WHERE state IN ('done', 'failed')") == 1
        }
        let outcome = try second.pool.query(
            "SELECT state, coalesce(apple_revocation, '-'), coalesce(last_error, '-') FROM deletion_requests"
        ).single()
        let lastError = try outcome.decode(String.self, 2)
        #expect(try outcome.decode(String.self, 0) == "done", "\(lastError)")
        #expect(try outcome.decode(String.self, 1) == "revoked")
        let revoked = first.simulator.revocations.filter {
            $0.sub == sub && $0.tokenTypeHint == "refresh_token" && $0.outcome == "revoked"
        }
        // The two client ids are one app group: Apple ends the group's authorization with the first
        // revoke, so the deletion's refresh check finds the other token dead and revokes it no more
        // (protocol reference §12.3). One real revocation, of a token of the group, with the new key.
        #expect(revoked.count == 1, "\(revoked)")
        #expect(Set(revoked.map(\.clientID)).isSubset(of: [TestBroker.clientID, TestBroker.webClientID]))

        // The tombstone names the sub by a hash keyed with k2: after the next rotation it is
        // still found while k2 stays configured, and no longer once k2 is removed.
        let deletionID = try #require(
            try second.pool.query("SELECT id::text FROM deletion_requests").single().decode(String?.self, 0))
        let bySub = #"{"apple_sub":"\#(sub)","reason":"again","requested_by":"test"}"#
        let next = "k3:" + Data(SecureRandom.bytes(32)).base64EncodedString()
        for (ring, expected) in [(next + "," + new, 410), (next, 404)] {
            let third = try TestBroker(database: database, roles: [.api], extra: ["TOKEN_ENCRYPTION_KEY": ring])
            let answer = try third.post("/v1/deletions", json: bySub, key: third.key([.compliance]))
            #expect(answer.status == expected, "\(ring.prefix(2)): \(answer.bodyText)")
            if expected == 410 { #expect(answer.json["deletion_id"] as? String == deletionID) }
        }
    }
}
