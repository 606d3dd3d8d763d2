import AppleSimulator
import BrokerCore
import Console
import Foundation
import HTTPClient
import PostgresClient
import TestSupport
import Testing

/// Issue 35, item 9: a TN3194 follow-up closes only on Apple's word about its own app group
/// (or the whole account), and stays closed once it did.
@Suite("Console follow-ups closed for good", .offPool)
struct ConsoleFollowUpClosureTests {
    static let other = "com.example.other"

    @Test(
        "a follow-up closes only on a consent-revoked of its own app group or an account-delete, and pruning the inbox never reopens it"
    )
    func closedForGood() throws {
        let broker = try ConsoleBroker(
            roles: [.api, .deletion, .notifications],
            extra: [
                "APPLE_CLIENT_IDS": "\(ConsoleBroker.clientID),\(Self.other)",
                "APPLE_APP_GROUPS": "\(ConsoleBroker.clientID);\(Self.other)",
                "BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1",
            ])
        // Two users of the app who hold no token: each deletion leaves the app's group to them.
        let first = try broker.signInUser(withCode: false)
        let second = try broker.signInUser(withCode: false)
        let key = try APIKeyStore(pool: broker.pool).create(name: "compliance", scopes: [.compliance]).secret
        var deletions: [UUID: String] = [:]
        for user in [first, second] {
            let body = #"{"user_id":"\#(user.id.uuidString.lowercased())","reason":"asked","requested_by":"support"}"#
            let answer = try broker.client.send(
                .init(
                    method: "POST", url: broker.apiURL + "/v1/deletions",
                    headers: [("Content-Type", "application/json"), ("Authorization", "Bearer \(key)")], body: Array(body.utf8)))
            #expect(answer.status == 202, "\(answer.bodyText)")
            let json = try JSONSerialization.jsonObject(with: Data(answer.body)) as? [String: Any]
            deletions[user.id] = try #require(json?["deletion_id"] as? String)
        }
        try waitUntil(seconds: 30) { try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 2 }
        let cookie = try broker.signIn(.compliance)
        func page() throws -> String { try broker.get("/follow-ups", cookie: cookie).bodyText }
        func notify(_ type: String, _ sub: String, _ clientID: String) throws {
            let result = try broker.simulator.sendNotification(
                NotificationRequest(
                    url: broker.apiURL + "/v1/apple/notifications", type: type, sub: sub, clientID: clientID))
            #expect(result.status == 200)
        }
        #expect(try page().contains("2 open of 2"))
        #expect(try page().contains(ConsoleBroker.clientID))

        // The user stops using another app group: this group's authorization is untouched.
        try notify("consent-revoked", first.sub, Self.other)
        #expect(try page().contains("2 open of 2"), "another app group's consent-revoked closes nothing")
        try notify("consent-revoked", first.sub, ConsoleBroker.clientID)
        #expect(try page().contains("1 open of 2"))
        try notify("account-delete", second.sub, ConsoleBroker.clientID)
        #expect(try page().contains("0 open of 2"))
        #expect(try page().contains("the user deleted the Apple Account"))

        // Housekeeping prunes the inbox (BROKER_NOTIFICATION_RETENTION_SECONDS): nothing reopens.
        try NotificationReceiver.prune(broker.pool, retention: .zero)
        #expect(try broker.count("SELECT count(*) FROM apple_notifications") == 0)
        #expect(try page().contains("0 open of 2"), "the closures are recorded, not re-read from the inbox")
        let report = try broker.get("/deletions/\(deletions[first.id]!)/report.json", cookie: cookie)
        let evidence = try #require(try JSONSerialization.jsonObject(with: Data(report.body)) as? [String: Any])
        #expect(evidence["follow_up"] as? String == "manual_revocation_closed")
        let groups = try #require(evidence["app_groups"] as? [[String: Any]])
        #expect(groups.count == 1)
        #expect(groups.first?["follow_up_closed_by"] as? String == "consent-revoked")
        #expect(groups.first?["apple_revocation"] as? String == "manual_required")
    }
}
