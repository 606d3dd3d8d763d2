import AppleSimulator
import BrokerAPI
import BrokerCore
import Foundation
import HTTPClient
import PostgresClient
import StrictJSON
import TestSupport
import Testing

/// Issue 35, items 5 and 10: a deletion reports only what Apple really ended, per app group
/// (protocol reference §12.3), and a handed-over code is used or refused, never dropped.
@Suite("Deletion outcomes per app group", .offPool)
struct DeletionOutcomeTests {
    static let fast = ["BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1"]
    /// The app and the web Services ID as two apps that stand alone at Apple.
    static let twoGroups = fast.merging(["APPLE_APP_GROUPS": "\(TestBroker.clientID);\(TestBroker.webClientID)"]) { $1 }

    func requestDeletion(_ broker: TestBroker, _ body: [String: Any]) throws -> HTTPClientResponse {
        let data = try JSONSerialization.data(withJSONObject: body)
        return try broker.post("/v1/deletions", json: String(decoding: data, as: UTF8.self), key: broker.key([.compliance]))
    }

    func waitForDeletions(_ broker: TestBroker, seconds: Double = 30) throws {
        try waitUntil(seconds: seconds) {
            try broker.count("SELECT count(*) FROM deletion_requests WHERE state NOT IN ('done', 'failed')") == 0
        }
    }

    func record(_ broker: TestBroker, _ id: String) throws -> [String: Any] {
        try broker.get("/v1/deletions/\(id)", key: broker.key([.compliance])).json
    }

    /// `app_id outcome follow_up` per app group of a deletion record.
    func groups(_ record: [String: Any]) -> [String] {
        ((record["app_groups"] as? [[String: Any]]) ?? []).map {
            "\($0["app_id"] as? String ?? "") \($0["apple_revocation"] as? String ?? "") \($0["follow_up"] as? String ?? "-")"
        }
    }

    /// The user.deleted event the purge wrote.
    func userDeleted(_ broker: TestBroker) throws -> [String: JSONValue] {
        let text = try broker.pool.query("SELECT payload::text AS p FROM outbox_events WHERE type = 'user.deleted'").single()
            .decode(String.self, "p")
        return try JSONValue.parseObject(Array(text.utf8))
    }

    /// `step:client_id:outcome` of a deletion's steps, in order.
    func steps(_ record: [String: Any]) -> [String] {
        ((record["steps"] as? [[String: Any]]) ?? []).map {
            "\($0["step"] as? String ?? ""):\($0["client_id"] as? String ?? "-"):\($0["outcome"] as? String ?? "")"
        }
    }

    @Test(
        "a refresh token a password change killed is not reported revoked: manual_required with its follow-up, in the record and user.deleted"
    )
    func deadTokenIsManual() throws {
        let broker = try TestBroker(roles: [.api, .deletion], extra: Self.fast)
        let (userID, sub) = try broker.signIn()
        // The password change: the refresh token dies, the user's authorization stays (forum 651237).
        #expect(broker.simulator.changePassword(teamID: TestBroker.teamID, sub: sub) == 1)
        let response = try requestDeletion(broker, ["user_id": userID.lowercasedString, "reason": "r", "requested_by": "q"])
        #expect(response.status == 202)
        let id = try #require(response.json["deletion_id"] as? String)
        try waitForDeletions(broker)

        let done = try record(broker, id)
        #expect(done["state"] as? String == "done")
        #expect(done["apple_revocation"] as? String == "manual_required", "Apple revoked nothing: \(done)")
        #expect(groups(done) == ["\(TestBroker.clientID) manual_required open"])
        #expect(
            steps(done).prefix(2) == [
                "check_token:\(TestBroker.clientID):token_dead",
                "nothing_to_revoke:\(TestBroker.clientID):manual_revocation_required",
            ], "\(steps(done))")
        // Nothing was sent to /auth/revoke for the dead token: its 200 would have proved nothing.
        #expect(broker.simulator.revocations.isEmpty, "\(broker.simulator.revocations)")
        #expect(!broker.simulator.consentRevoked(teamID: TestBroker.teamID, sub: sub, clientID: TestBroker.clientID))
        let event = try userDeleted(broker)
        #expect(event["apple_revocation"]?.stringValue == "manual_required")
        #expect(event["apple_revocation_by_app"] == .object([TestBroker.clientID: "manual_required"]))
    }

    @Test(
        "two app groups, a live token in one: that group revoked, the other manual with a follow-up of its own; never a bare revoked"
    )
    func perAppGroup() throws {
        let broker = try TestBroker(roles: [.api, .deletion], extra: Self.twoGroups)
        // The user signed in to the app with a code (a refresh token), then to the web app
        // with a token alone: two app groups used, a live token in one.
        let (userID, sub) = try broker.signIn(clients: [TestBroker.clientID])
        let web = try broker.login([
            "identity_token": try broker.mint {
                $0.clientID = TestBroker.webClientID
                $0.sub = sub
            }.idToken
        ])
        #expect(web.status == 200, "\(web.bodyText)")
        let response = try requestDeletion(broker, ["user_id": userID.lowercasedString, "reason": "r", "requested_by": "q"])
        let id = try #require(response.json["deletion_id"] as? String)
        try waitForDeletions(broker)

        let done = try record(broker, id)
        #expect(done["state"] as? String == "done")
        #expect(done["apple_revocation"] as? String == "manual_required", "the web app's group still needs the user")
        #expect(
            groups(done) == ["\(TestBroker.clientID) revoked -", "\(TestBroker.webClientID) manual_required open"], "\(done)")
        #expect(steps(done).contains("check_token:\(TestBroker.clientID):alive"))
        #expect(steps(done).contains("revoke:\(TestBroker.clientID):revoked"))
        #expect(steps(done).contains("nothing_to_revoke:\(TestBroker.webClientID):manual_revocation_required"))
        // Apple ended the app's authorization only; the web app's stays until the user ends it.
        #expect(broker.simulator.consentRevoked(teamID: TestBroker.teamID, sub: sub, clientID: TestBroker.clientID))
        #expect(broker.simulator.revocations.allSatisfy { $0.clientID == TestBroker.clientID })
        let event = try userDeleted(broker)
        #expect(event["apple_revocation"]?.stringValue == "manual_required")
        #expect(
            event["apple_revocation_by_app"]
                == .object([TestBroker.clientID: "revoked", TestBroker.webClientID: "manual_required"]))
    }

    @Test("a code handed over to a deletion already open is exchanged at once, and what it yields is revoked before the purge")
    func codeToOpenDeletion() throws {
        let broker = try TestBroker(roles: [.api, .deletion], extra: Self.fast)
        let (userID, sub) = try broker.signIn()
        // Apple's 503 on every revoke holds the first request open until the code comes.
        var faults = FaultSettings()
        faults.errorRate = 1
        faults.errorStatuses = [503]
        faults.retryAfterSeconds = 2
        faults.endpoints = ["revoke"]
        broker.simulator.faults = faults
        let first = try requestDeletion(broker, ["user_id": userID.lowercasedString, "reason": "r", "requested_by": "q"])
        let id = try #require(first.json["deletion_id"] as? String)
        try waitUntil(seconds: 10) {
            try broker.count("SELECT count(*) FROM deletion_steps WHERE outcome = 'retry' AND step = 'revoke'") > 0
        }
        broker.simulator.faults = FaultSettings()
        // The app re-authenticated the user to delete the account (TN3194): a fresh code.
        let code = broker.simulator.issueCode(teamID: TestBroker.teamID, sub: sub, clientID: TestBroker.clientID)
        let calls = broker.simulator.statistics.token
        let second = try requestDeletion(
            broker, ["user_id": userID.lowercasedString, "reason": "r", "requested_by": "q", "authorization_code": code])
        #expect(second.status == 202, "\(second.bodyText)")
        #expect(second.json["deletion_id"] as? String == id)
        #expect(second.json["created"] as? Bool == false)
        // Exchanged in the request itself, before the answer: the code's five minutes never ran out in a queue.
        #expect(
            try broker.count(
                "SELECT count(*) FROM deletion_steps WHERE step = 'code_exchange' AND outcome = 'exchanged' AND deletion_id = \(UUID(uuidString: id)!)"
            ) == 1)
        #expect(broker.simulator.statistics.token > calls)
        try waitForDeletions(broker)
        let done = try record(broker, id)
        #expect(done["apple_revocation"] as? String == "revoked", "\(steps(done))")
        #expect(groups(done) == ["\(TestBroker.clientID) revoked -"])
        #expect(broker.simulator.consentRevoked(teamID: TestBroker.teamID, sub: sub, clientID: TestBroker.clientID))
    }

    @Test(
        "a code handed over to a failed deletion is refused with a problem naming it, unsent; Apple's 429 keeps a code for another try"
    )
    func codeToFailedDeletionAndThrottling() throws {
        let broker = try TestBroker(
            roles: [.api, .deletion], extra: Self.fast.merging(["BROKER_DELETION_MAX_ATTEMPTS": "3"]) { $1 })
        let (userID, sub) = try broker.signIn()
        // Apple failing every token and revoke call: the deletion dead-letters.
        var faults = FaultSettings()
        faults.errorRate = 1
        faults.errorStatuses = [500]
        faults.endpoints = ["token", "revoke"]
        broker.simulator.faults = faults
        let first = try requestDeletion(broker, ["user_id": userID.lowercasedString, "reason": "r", "requested_by": "q"])
        let id = try #require(first.json["deletion_id"] as? String)
        try waitForDeletions(broker)
        #expect(try record(broker, id)["state"] as? String == "failed")
        broker.simulator.faults = FaultSettings()

        let code = broker.simulator.issueCode(teamID: TestBroker.teamID, sub: sub, clientID: TestBroker.clientID)
        let calls = broker.simulator.statistics.token
        let refused = try requestDeletion(
            broker, ["user_id": userID.lowercasedString, "reason": "r", "requested_by": "q", "authorization_code": code])
        #expect(refused.status == 409, "never 202 with the code dropped: \(refused.bodyText)")
        #expect(refused.json["code"] as? String == "deletion_code_refused")
        #expect(refused.json["deletion_id"] as? String == id)
        #expect((refused.json["detail"] as? String)?.contains("retry") == true)
        #expect(broker.simulator.statistics.token == calls, "the code was not sent to Apple: it stays good")

        // Retried, the deletion takes the same code, still good, at once. Apple's revoke stalls
        // for a while first (before doing anything), so the retried deletion cannot end before the
        // code arrives, however slow this run is (under ThreadSanitizer it once did: 409).
        var stall = FaultSettings()
        stall.timeoutRate = 1
        stall.timeoutMilliseconds = 5_000
        stall.timeoutAfterWork = false
        stall.endpoints = ["revoke"]
        broker.simulator.faults = stall
        #expect(try broker.post("/v1/deletions/\(id)/retry", json: "{}", key: broker.key([.compliance])).status == 202)
        let handed = try requestDeletion(
            broker, ["user_id": userID.lowercasedString, "reason": "r", "requested_by": "q", "authorization_code": code])
        #expect(handed.status == 202, "\(handed.bodyText)")
        broker.simulator.faults = FaultSettings()
        try waitForDeletions(broker)
        let done = try record(broker, id)
        #expect(done["state"] as? String == "done", "\(steps(done))")
        #expect(steps(done).contains("code_exchange:\(TestBroker.clientID):exchanged"), "\(steps(done))")
        #expect(done["apple_revocation"] as? String == "revoked")
    }

    @Test("Apple's 429 on a handed-over code's exchange is no lost answer: the code is kept and exchanged on the next try")
    func throttledCodeIsKept() throws {
        let broker = try TestBroker(roles: [.api, .deletion], extra: Self.fast)
        let (userID, sub) = try broker.signIn()
        var faults = FaultSettings()
        faults.errorRate = 1
        faults.errorStatuses = [429]
        faults.retryAfterSeconds = 1
        faults.endpoints = ["token"]
        broker.simulator.faults = faults
        let code = broker.simulator.issueCode(teamID: TestBroker.teamID, sub: sub, clientID: TestBroker.clientID)
        let response = try requestDeletion(
            broker, ["user_id": userID.lowercasedString, "reason": "r", "requested_by": "q", "authorization_code": code])
        #expect(response.status == 202, "\(response.bodyText)")
        let id = try #require(response.json["deletion_id"] as? String)
        // The request's own exchange met the 429: Apple did nothing, so the code waits for another try.
        let first = steps(try record(broker, id)).filter { $0.hasPrefix("code_exchange") }
        #expect(first == ["code_exchange:\(TestBroker.clientID):throttled"], "\(first)")
        // (After Retry-After the job may try again while the 429s last, as it would at Apple: throttled again.)
        broker.simulator.faults = FaultSettings()
        try waitForDeletions(broker)
        let done = try record(broker, id)
        let exchanges = steps(done).filter { $0.hasPrefix("code_exchange") }
        #expect(exchanges.last == "code_exchange:\(TestBroker.clientID):exchanged", "\(exchanges)")
        #expect(
            exchanges.count >= 2 && exchanges.dropLast().allSatisfy { $0 == "code_exchange:\(TestBroker.clientID):throttled" },
            "\(exchanges)")
        #expect(done["state"] as? String == "done")
        #expect(done["apple_revocation"] as? String == "revoked")
    }
}
