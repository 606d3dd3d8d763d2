import BrokerCore
import Dispatch
import Foundation
import Locking
import PostgresClient
import TestSupport
import Testing

/// `RepeatSignInStore`: the writes of concurrent repeat logins go to PostgreSQL together, one
/// statement and one commit, with the outcome of one statement each. The batch is made by
/// holding the first sign-in on a row lock until the others are queued, never by timing.
@Suite("Repeat sign-ins", .offPool)
struct RepeatSignInTests {
    /// Writes `signIns` on threads of their own while `held` is locked by another transaction:
    /// the first goes alone and waits on the lock, the others queue behind it and go together
    /// once the lock is let go. Answers by identity.
    func writeWhileHeld(
        _ store: RepeatSignInStore, _ fixture: StoreFixture, held: UUID, first: RepeatSignInStore.SignIn,
        then signIns: [RepeatSignInStore.SignIn]
    ) throws -> [UUID: Result<Bool, any Error>] {
        let locker = try PostgresConnection(configuration: fixture.pool.configuration.connection)
        try locker.execute("BEGIN")
        try locker.query("SELECT 1 FROM apple_identities WHERE id = \(held) FOR UPDATE")
        let answers = Lock<[UUID: Result<Bool, any Error>]>([:])
        let done = DispatchSemaphore(value: 0)
        func write(_ signIn: RepeatSignInStore.SignIn) {
            Thread.detachNewThread {
                let answer = Result { try store.write(signIn) }
                answers.withLock { $0[signIn.identityID] = answer }
                done.signal()
            }
        }
        write(first)
        waitUntil { store.statistics.inFlight == 1 }
        #expect(store.statistics.inFlight == 1)
        for signIn in signIns { write(signIn) }
        waitUntil { store.statistics.queued == signIns.count }
        #expect(store.statistics.queued == signIns.count)
        try locker.execute("COMMIT")
        for _ in 0...signIns.count { #expect(done.wait(timeout: .now() + 20) == .success) }
        return answers.withLock { $0 }
    }

    @Test("concurrent repeat sign-ins are one statement: last logins touched, sign-ins recorded, a purged identity false")
    func together() throws {
        let fixture = try StoreFixture()
        let store = RepeatSignInStore(pool: fixture.pool)
        let stale = Date().addingTimeInterval(-3_600)
        let identities = try (0..<4).map { _ in try fixture.user(lastLogin: stale).identity }
        let signedInAt = Date(timeIntervalSince1970: 1_796_000_000)
        let purged = UUID()  // No such identity (purged between the read and the write).
        let signIns =
            identities.dropFirst().enumerated().map { index, identity in
                RepeatSignInStore.SignIn(
                    identityID: identity, appID: "com.example.app", signedInAt: signedInAt, touch: true, record: index != 0)
            } + [.init(identityID: purged, appID: "com.example.app", signedInAt: signedInAt, touch: true, record: true)]
        let before = store.statistics
        let answers = try writeWhileHeld(
            store, fixture, held: identities[0],
            first: .init(identityID: identities[0], appID: "com.example.app", signedInAt: signedInAt, touch: true, record: false),
            then: signIns)

        for identity in identities { #expect(try answers[identity]?.get() == true) }
        #expect(try answers[purged]?.get() == false)
        let after = store.statistics
        #expect(after.batches - before.batches == 2 && after.items - before.items == 5)
        // Every touched identity's last_login_at moved; the sign-ins recorded are on the timeline.
        #expect(try fixture.count("SELECT count(*) FROM apple_identities WHERE last_login_at > \(stale)") == 4)
        let recorded = try fixture.pool.query(
            "SELECT identity_id, signed_in_at FROM apple_grants WHERE app_id = 'com.example.app' ORDER BY identity_id")
        #expect(try Set(recorded.map { try $0.decode(UUID.self, "identity_id") }) == Set(identities.suffix(2)))
        #expect(try recorded.allSatisfy { try $0.decode(Date.self, "signed_in_at") == signedInAt })
    }

    @Test("a batch that fails is written again one sign-in at a time: only the failing sign-in fails")
    func failureStaysItsOwn() throws {
        let fixture = try StoreFixture()
        let store = RepeatSignInStore(pool: fixture.pool)
        let stale = Date().addingTimeInterval(-3_600)
        let identities = try (0..<4).map { _ in try fixture.user(lastLogin: stale).identity }
        let now = Date()
        // Past timestamptz's range (year 294276): PostgreSQL refuses the batch's array, then this sign-in.
        let outOfRange = Date(timeIntervalSince1970: 9_400_000_000_000)
        let answers = try writeWhileHeld(
            store, fixture, held: identities[0],
            first: .init(identityID: identities[0], appID: "com.example.app", signedInAt: now, touch: true, record: false),
            then: [
                .init(identityID: identities[1], appID: "com.example.app", signedInAt: now, touch: true, record: true),
                .init(identityID: identities[2], appID: "com.example.app", signedInAt: outOfRange, touch: true, record: true),
                .init(identityID: identities[3], appID: "com.example.app", signedInAt: now, touch: true, record: true),
            ])
        #expect(try answers[identities[0]]?.get() == true)
        #expect(try answers[identities[1]]?.get() == true)
        #expect(try answers[identities[3]]?.get() == true)
        #expect(throws: PostgresError.self) { try answers[identities[2]]?.get() }
        #expect(try fixture.count("SELECT count(*) FROM apple_identities WHERE last_login_at > \(stale)") == 3)
        #expect(try fixture.count("SELECT count(*) FROM apple_grants WHERE identity_id = \(identities[2])") == 0)
    }
}
