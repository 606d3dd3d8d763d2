import Foundation
import PostgresClient
import Workers

/// The writes of repeat logins that change nothing else (`broker_repeat_sign_in`: a stale
/// `last_login_at`, a sign-in newer than the group's authorization timeline), written for
/// many logins at once: the sign-ins that arrive while one batch is at the server go in the
/// next, as one statement and one commit, and each login waits for the commit of its own.
///
/// Why: in production nearly every repeat login writes (a fresh identity token is a newer
/// sign-in; a user seldom signs in twice a minute), and a commit each cost 250 µs of CPU per
/// login against 140 for the read alone, most of it per statement and per commit rather than
/// per row (docs/benchmarks.md, 2026-12-04, fifth). Batched, the commit is shared.
///
/// - Same outcome per login as one statement each: the function runs once per sign-in, in one
///   transaction; the rows are locked in identity order, so two batches (two brokers) take
///   them in one order. A batch that fails (a deadlock with another writer, a purge's lock
///   timeout) is run again one statement per sign-in, so one sign-in's error stays its own.
/// - Durable before the answer, as before: the login returns after its batch committed.
/// - Bounds: `maximumBatch` sign-ins per statement; callers block, so no more wait than there
///   are HTTP worker threads.
package struct RepeatSignInStore: Sendable {
    package struct SignIn: Sendable {
        package var identityID: UUID
        package var appID: String
        package var signedInAt: Date
        /// Rewrite the stale last_login_at and last_verified_at.
        package var touch: Bool
        /// Put the sign-in on the group's authorization timeline.
        package var record: Bool

        package init(identityID: UUID, appID: String, signedInAt: Date, touch: Bool, record: Bool) {
            self.identityID = identityID
            self.appID = appID
            self.signedInAt = signedInAt
            self.touch = touch
            self.record = record
        }
    }

    package static let maximumBatch = 64

    private let coalescer: Coalescer<SignIn, Bool>

    package init(pool: PostgresPool) {
        coalescer = Coalescer(name: "repeat-sign-ins", maximumBatch: Self.maximumBatch) { batch in
            Self.write(batch, pool: pool)
        }
    }

    /// Writes one sign-in with those of concurrent logins; false when the identity is gone
    /// (purged meanwhile: broker_login_v2 then decides).
    package func write(_ signIn: SignIn) throws -> Bool { try coalescer.submit(signIn) }

    /// Sign-ins written, the batches they went in (a batch run again one by one counts once),
    /// sign-ins waiting for the next batch and those of the batch at the server.
    package var statistics: (items: Int, batches: Int, queued: Int, inFlight: Int) {
        let statistics = coalescer.statistics
        return (statistics.items, statistics.batches, statistics.queued, statistics.inFlight)
    }

    private static func write(_ batch: [SignIn], pool: PostgresPool) -> [Result<Bool, any Error>] {
        if batch.count > 1, let written = try? writeTogether(batch, pool: pool) { return written.map { .success($0) } }
        return batch.map { signIn in Result { try writeOne(signIn, pool: pool) } }
    }

    private static func writeOne(_ signIn: SignIn, pool: PostgresPool) throws -> Bool {
        try pool.query(
            """
            SELECT broker_repeat_sign_in(\(signIn.identityID), \(signIn.appID), \(signIn.signedInAt)::timestamptz,
                \(signIn.touch), \(signIn.record)) AS written
            """
        ).single().decode(Bool.self, "written")
    }

    /// One statement for the batch, the function called per sign-in in identity order (one
    /// identity's sign-ins in the order they came, as one statement each would run them); the
    /// answers come back in the batch's order.
    private static func writeTogether(_ batch: [SignIn], pool: PostgresPool) throws -> [Bool] {
        let keys = batch.map(\.identityID.lowercasedString)
        let order = batch.indices.sorted { keys[$0] < keys[$1] || (keys[$0] == keys[$1] && $0 < $1) }
        let sorted = order.map { batch[$0] }
        let rows = try pool.query(
            """
            SELECT x.n, broker_repeat_sign_in(x.identity_id, x.app_id, x.signed_in_at, x.touch, x.record) AS written
            FROM unnest(\(PostgresTextArray(binding: sorted.map(\.identityID)))::uuid[],
                        \(PostgresTextArray(sorted.map(\.appID)))::text[],
                        \(PostgresTextArray(binding: sorted.map(\.signedInAt)))::timestamptz[],
                        \(PostgresTextArray(binding: sorted.map(\.touch)))::boolean[],
                        \(PostgresTextArray(binding: sorted.map(\.record)))::boolean[])
                 WITH ORDINALITY AS x(identity_id, app_id, signed_in_at, touch, record, n)
            """)
        var written = [Bool](repeating: false, count: batch.count)
        var answered = 0
        for row in rows {
            let position = try row.decode(Int.self, "n") - 1
            guard sorted.indices.contains(position) else { throw PostgresError(.queryFailed) }
            written[order[position]] = try row.decode(Bool.self, "written")
            answered += 1
        }
        guard answered == batch.count else { throw PostgresError(.queryFailed) }
        return written
    }
}
