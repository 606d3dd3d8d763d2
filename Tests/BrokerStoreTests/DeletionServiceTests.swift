import BrokerCore
import Foundation
import PostgresClient
import Synchronization
import TestSupport
import Testing

/// The deletion service's rules that other modules use (the console's deadline extension and
/// receipt), against a migrated database without a broker.
@Suite("Deletion service", .offPool)
struct DeletionServiceTests {
    let day: TimeInterval = 86_400

    func opened(_ fixture: StoreFixture) throws -> (service: DeletionService, id: UUID) {
        let service = DeletionService(store: DeletionStore(pool: fixture.pool, teamID: fixture.teamID))
        let user = try fixture.user().user
        let opened = try service.request(
            .init(target: .user(user), reason: "user asked", requestedBy: "dpo@example.com"), source: .api,
            actor: "console:alice")
        return (service, opened.id)
    }

    @Test("a deadline extends only past the first month and within 90 days of receipt, audited, never once done")
    func extensionRule() throws {
        let fixture = try StoreFixture()
        let (service, id) = try opened(fixture)
        let received = Date().addingTimeInterval(-10 * day)
        let receipt = AuditLog.Record(actor: "console:alice", action: "console.deletion_requested")
        try service.annotate(id, receivedAt: received, ticket: "T-1", audit: receipt)
        func extend(daysAfterReceipt days: Double) throws -> Bool {
            try service.extendDeadline(
                id, until: received.addingTimeInterval(days * day), reason: "complex request",
                audit: AuditLog.Record(actor: "console:alice", action: "console.deletion_extended"))
        }
        #expect(try !extend(daysAfterReceipt: 20), "within the first month is no extension")
        #expect(try !extend(daysAfterReceipt: 30), "the first month's end is the deadline itself")
        #expect(try !extend(daysAfterReceipt: 90.5), "past two further months")
        #expect(try extend(daysAfterReceipt: 60))
        #expect(try extend(daysAfterReceipt: 90), "90 days after receipt at most")

        let note = try #require(try service.store.annotations([id])[id])
        #expect(note.ticket == "T-1" && note.extensionReason == "complex request")
        let due = DeletionDeadline.due(receivedAt: note.receivedAt, createdAt: Date(), extendedUntil: note.extendedUntil)
        #expect(abs(due.timeIntervalSince(received.addingTimeInterval(90 * day))) < 1)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM audit_log WHERE deletion_id = \(id) AND action = 'console.deletion_extended'") == 2)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM audit_log WHERE deletion_id = \(id) AND action = 'console.deletion_requested'") == 1)

        try fixture.pool.query("UPDATE deletion_requests SET state = 'done', completed_at = now() WHERE id = \(id)")
        #expect(try !extend(daysAfterReceipt: 70), "a done request has been answered")
    }

    @Test("the deadline runs from the receipt, else from the request; the receipt is recorded once")
    func deadline() throws {
        let fixture = try StoreFixture()
        let (service, id) = try opened(fixture)
        let created = Date()
        #expect(
            abs(
                DeletionDeadline.due(receivedAt: nil, createdAt: created, extendedUntil: nil).timeIntervalSince(created) - 30
                    * day)
                < 1)
        let first = Date().addingTimeInterval(-3 * day)
        let audit = AuditLog.Record(actor: "console:alice", action: "console.deletion_requested")
        try service.annotate(id, receivedAt: first, ticket: "T-1", audit: audit)
        try service.annotate(id, receivedAt: Date(), ticket: "T-2", audit: audit)
        let note = try #require(try service.store.annotations([id])[id])
        #expect(note.ticket == "T-1" && abs(note.receivedAt!.timeIntervalSince(first)) < 1)
    }

    @Test("a code the request exchanges itself holds the deletion back from the job from the commit that attaches it")
    func codeHeldForTheRequest() throws {
        let fixture = try StoreFixture()
        let store = DeletionStore(pool: fixture.pool, teamID: fixture.teamID)
        let code = DeletionStore.SealedCode(sealed: [1, 2, 3], keyID: "k1", clientID: nil, redirectURI: nil)
        // The API exchanges the code right after this commit: no job may claim the request in between,
        // or it would decide the revoke phase without the tokens the exchange yields.
        let first = try fixture.user().user
        let held = try #require(
            try store.request(
                userID: first, source: .api, reason: "r", requestedBy: "q", code: code, exchangeLease: .seconds(60)))
        #expect(try store.claim(limit: 10, lease: .seconds(30)).isEmpty)
        #expect(try fixture.count("SELECT count(*) FROM deletion_requests WHERE code_exchange_until > now()") == 1)
        // The exchange over, the job gets it at once.
        #expect(try store.takeCode(held.id, lease: .seconds(60)) != nil)
        try store.releaseLease(held.id)
        #expect(try store.claim(limit: 10, lease: .seconds(30)).map(\.id) == [held.id])
        // A code left to the job (the CLI, or a database failure in the request): due at once.
        let second = try fixture.user().user
        let queued = try #require(try store.request(userID: second, source: .cli, reason: "r", requestedBy: "q", code: code))
        #expect(try store.claim(limit: 10, lease: .seconds(30)).map(\.id) == [queued.id])
    }

    @Test("a retry queues only a failed request again, audited, and wakes the job in this process")
    func retry() throws {
        let fixture = try StoreFixture()
        let woken = Atomic<Int>(0)
        let service = DeletionService(
            store: DeletionStore(pool: fixture.pool, teamID: fixture.teamID), wake: { woken.add(1, ordering: .relaxed) })
        let user = try fixture.user().user
        let id = try service.request(
            .init(target: .user(user), reason: "user asked", requestedBy: "dpo@example.com"), source: .api,
            actor: "console:alice"
        ).id
        let before = woken.load(ordering: .relaxed)
        #expect(try !service.retry(id, by: "console:alice"), "not failed")
        #expect(woken.load(ordering: .relaxed) == before)
        try fixture.pool.query("UPDATE deletion_requests SET state = 'failed' WHERE id = \(id)")
        #expect(try service.retry(id, by: "console:alice"))
        #expect(woken.load(ordering: .relaxed) == before + 1)
        #expect(try fixture.count("SELECT count(*) FROM deletion_requests WHERE id = \(id) AND state = 'requested'") == 1)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM audit_log WHERE deletion_id = \(id) AND action = 'deletion.retried' AND actor = 'console:alice'"
            )
                == 1)
    }
}
