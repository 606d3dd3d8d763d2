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
    typealias SignIn = RepeatSignInStore.SignIn
    struct NoAnswer: Error {}
    let app = "com.example.app"

    /// A fresh database with four users whose last login is an hour old, and a store on it.
    func setUp() throws -> (fixture: StoreFixture, store: RepeatSignInStore, stale: Date, identities: [UUID]) {
        let fixture = try StoreFixture()
        let stale = Date().addingTimeInterval(-3_600)
        let identities = try (0..<4).map { _ in try fixture.user(lastLogin: stale).identity }
        return (fixture, RepeatSignInStore(pool: fixture.pool), stale, identities)
    }

    /// Writes `first`, then `signIns`, each on a thread of its own, while `first`'s identity is
    /// locked by another transaction: `first` goes alone and waits on the lock, the others queue
    /// behind it, one after the other in their order, and go together once the lock is let go.
    /// Answers in that order, `first`'s first.
    func writeWhileHeld(
        _ store: RepeatSignInStore, _ fixture: StoreFixture, first: SignIn, then signIns: [SignIn]
    ) throws -> [Result<Bool, any Error>] {
        let locker = try PostgresConnection(configuration: fixture.pool.configuration.connection)
        try locker.execute("BEGIN")
        try locker.query("SELECT 1 FROM apple_identities WHERE id = \(first.identityID) FOR UPDATE")
        let answers = Lock<[Int: Result<Bool, any Error>]>([:])
        let done = DispatchSemaphore(value: 0)
        func write(_ signIn: SignIn, _ position: Int) {
            Thread.detachNewThread {
                let answer = Result { try store.write(signIn) }
                answers.withLock { $0[position] = answer }
                done.signal()
            }
        }
        write(first, 0)
        waitUntil { store.statistics.inFlight == 1 }
        #expect(store.statistics.inFlight == 1)
        for (index, signIn) in signIns.enumerated() {
            write(signIn, index + 1)
            waitUntil { store.statistics.queued == index + 1 }  // Queued in this order, not the threads'.
        }
        #expect(store.statistics.queued == signIns.count)
        try locker.execute("COMMIT")
        for _ in 0...signIns.count { #expect(done.wait(timeout: .now() + 20) == .success) }
        let all = answers.withLock { $0 }
        return (0...signIns.count).map { all[$0] ?? .failure(NoAnswer()) }
    }

    @Test("concurrent repeat sign-ins are one statement: last logins touched, sign-ins recorded, a purged identity false")
    func together() throws {
        let (fixture, store, stale, identities) = try setUp()
        let signedInAt = Date(timeIntervalSince1970: 1_796_000_000)
        let purged = UUID()  // No such identity (purged between the read and the write).
        let before = store.statistics
        let answers = try writeWhileHeld(
            store, fixture,
            first: .init(identityID: identities[0], appID: app, signedInAt: signedInAt, touch: true, record: false),
            then: [
                .init(identityID: identities[1], appID: app, signedInAt: signedInAt, touch: true, record: false),
                .init(identityID: identities[2], appID: app, signedInAt: signedInAt, touch: true, record: true),
                .init(identityID: identities[3], appID: app, signedInAt: signedInAt, touch: true, record: true),
                .init(identityID: purged, appID: app, signedInAt: signedInAt, touch: true, record: true),
            ])

        #expect(try answers.map { try $0.get() } == [true, true, true, true, false])
        let after = store.statistics
        #expect(after.batches - before.batches == 2 && after.items - before.items == 5)
        // Every touched identity's last_login_at moved; the sign-ins recorded are on the timeline.
        #expect(try fixture.count("SELECT count(*) FROM apple_identities WHERE last_login_at > \(stale)") == 4)
        let recorded = try fixture.pool.query("SELECT identity_id, signed_in_at FROM apple_grants WHERE app_id = \(app)")
        #expect(try Set(recorded.map { try $0.decode(UUID.self, "identity_id") }) == Set(identities.suffix(2)))
        #expect(try recorded.allSatisfy { try $0.decode(Date.self, "signed_in_at") == signedInAt })
    }

    @Test("in one batch, a token's sign-in that Apple made earlier than one already written moves the timeline back for nobody")
    func timelineByApplesTime() throws {
        let (fixture, store, _, identities) = try setUp()
        let later = Date(timeIntervalSince1970: 1_796_000_600)
        let earlier = Date(timeIntervalSince1970: 1_796_000_000)
        // Both reach the same batch; the later sign-in arrives first (the earlier token travelled
        // slowly), so a batch that let the last write win would move the timeline back.
        let answers = try writeWhileHeld(
            store, fixture,
            first: .init(identityID: identities[0], appID: app, signedInAt: later, touch: true, record: false),
            then: [
                .init(identityID: identities[1], appID: app, signedInAt: later, touch: false, record: true),
                .init(identityID: identities[1], appID: app, signedInAt: earlier, touch: false, record: true),
            ])
        #expect(try answers.map { try $0.get() } == [true, true, true])
        let grant = try fixture.pool.query(
            "SELECT signed_in_at, consent_at FROM apple_grants WHERE identity_id = \(identities[1]) AND app_id = \(app)"
        ).single()
        #expect(try grant.decode(Date.self, "signed_in_at") == later)
        #expect(try grant.decode(Date.self, "consent_at") == later)
    }

    @Test("a batch that fails is written again one sign-in at a time: only the failing sign-in fails")
    func failureStaysItsOwn() throws {
        let (fixture, store, stale, identities) = try setUp()
        let now = Date()
        // Past timestamptz's range (year 294276): PostgreSQL refuses the batch's array, then this sign-in.
        let outOfRange = Date(timeIntervalSince1970: 9_400_000_000_000)
        let answers = try writeWhileHeld(
            store, fixture,
            first: .init(identityID: identities[0], appID: app, signedInAt: now, touch: true, record: false),
            then: [
                .init(identityID: identities[1], appID: app, signedInAt: now, touch: true, record: true),
                .init(identityID: identities[2], appID: app, signedInAt: outOfRange, touch: true, record: true),
                .init(identityID: identities[3], appID: app, signedInAt: now, touch: true, record: true),
            ])
        #expect(try answers[0].get() && answers[1].get() && answers[3].get())
        #expect(throws: PostgresError.self) { try answers[2].get() }
        #expect(try fixture.count("SELECT count(*) FROM apple_identities WHERE last_login_at > \(stale)") == 3)
        #expect(try fixture.count("SELECT count(*) FROM apple_grants WHERE identity_id = \(identities[2])") == 0)
    }
}
