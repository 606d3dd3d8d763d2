import Dispatch
import Foundation
import Locking
import PostgresClient
import TestSupport
import Testing

/// `PostgresPool.read`: read-only statements of concurrent callers share round trips on a
/// connection of the pool's own (`PostgresReadPipeline`). A batch is held at the server by an
/// advisory lock the test holds, so which statements go together is decided by the test, not
/// by timing.
@Suite("PostgresPool.read (the read pipeline)", .offPool)
struct PostgresReadPipelineTests {
    private func makePool(_ configuration: PostgresConfiguration) -> PostgresPool {
        PostgresPool(configuration: .init(connection: configuration, maximumConnections: 2))
    }

    /// Runs `body` on a thread of its own; `wait()` returns its result.
    private final class Running<T: Sendable>: Sendable {
        private let result = Lock<Result<T, any Error>?>(nil)
        private let done = DispatchSemaphore(value: 0)
        init(_ body: @escaping @Sendable () throws -> T) {
            Thread { [self] in
                let outcome = Result { try body() }
                result.withLock { $0 = outcome }
                done.signal()
            }.start()
        }
        func wait() -> Result<T, any Error> {
            done.wait()
            return result.withLock { $0! }
        }
    }

    /// A read that waits at the server until `admin` releases advisory lock 42.
    private func blockedRead(_ pool: PostgresPool, admin: PostgresConnection) throws -> Running<Int> {
        let running = Running {
            try pool.read("SELECT pg_advisory_xact_lock_shared(42)::text, 0 AS n").single().decode(Int.self, "n")
        }
        try waitUntil {
            try admin.query(
                """
                SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
                    AND query LIKE '%pg_advisory_xact_lock_shared%'
                """
            ).single().decode(Int.self, 0) == 1
        }
        return running
    }

    @Test("a statement alone goes out at once, one statement in one batch")
    func alone() throws {
        let pool = makePool(try TestPostgres.freshDatabase())
        #expect(try pool.read("SELECT \(7)::int AS n").single().decode(Int.self, "n") == 7)
        let statistics = pool.statistics
        #expect(statistics.pipelinedReads == 1 && statistics.pipelineBatches == 1 && statistics.statements == 1)
        #expect(statistics.open == 0, "the pool's own connections are not used")
    }

    @Test(
        "statements that arrive while a batch is at the server go out together; each caller gets its own rows, a failing one fails alone, and one that writes is refused"
    )
    func batches() throws {
        let configuration = try TestPostgres.freshDatabase()
        let pool = makePool(configuration)
        try pool.query("CREATE TABLE t (n int)")
        let admin = try PostgresConnection(configuration: configuration)
        try admin.query("SELECT pg_advisory_lock(42)")
        let blocker = try blockedRead(pool, admin: admin)

        // Queued one after another, so the batch's order (and what a failure aborts) is known.
        var reads: [Running<Int>] = []
        for index in 0..<8 {
            reads.append(
                Running {
                    switch index {
                    case 3: try pool.read("SELECT 1 / \(0) AS n").single().decode(Int.self, "n")
                    case 5: try pool.read("INSERT INTO t VALUES (\(index)) RETURNING n").single().decode(Int.self, "n")
                    default: try pool.read("SELECT \(index)::int AS n").single().decode(Int.self, "n")
                    }
                })
            waitUntil { pool.statistics.pipelineQueued == index + 1 }
        }
        #expect(pool.statistics.pipelineQueued == 8)
        try admin.query("SELECT pg_advisory_unlock(42)")

        #expect(try blocker.wait().get() == 0)
        let results = reads.map { $0.wait() }
        for index in [0, 1, 2, 4, 6, 7] { #expect((try? results[index].get()) == index, "\(results[index])") }
        #expect((results[3].error as? PostgresError)?.sqlState == "22012", "division by zero: \(results[3])")
        #expect((results[5].error as? PostgresError)?.sqlState == "25006", "read-only transaction: \(results[5])")
        #expect(try pool.query("SELECT count(*) FROM t").single().decode(Int.self, 0) == 0)
        // The blocker's batch, the eight together, then what the two failures aborted: 4-7, then 6-7.
        let statistics = pool.statistics
        #expect(statistics.pipelineBatches == 4 && statistics.pipelinedReads == 1 + 8 + 4 + 2, "\(statistics)")
        #expect(statistics.pipelineQueued == 0)
    }

    @Test(
        "a killed connection fails the batch in flight as lost; the next read reconnects, and a dead idle connection is noticed before use"
    )
    func reconnects() throws {
        let configuration = try TestPostgres.freshDatabase()
        let pool = makePool(configuration)
        let admin = try PostgresConnection(configuration: configuration)
        let first = try pool.read("SELECT pg_backend_pid() AS pid").single().decode(Int.self, "pid")

        try admin.query("SELECT pg_advisory_lock(42)")
        let blocked = try blockedRead(pool, admin: admin)
        try admin.query("SELECT pg_terminate_backend(\(first))")
        let lost = blocked.wait().error as? PostgresError
        #expect(lost?.code == .connectionLost && lost?.isUnavailable == true, "\(String(describing: lost))")
        try admin.query("SELECT pg_advisory_unlock(42)")

        let second = try pool.read("SELECT pg_backend_pid() AS pid").single().decode(Int.self, "pid")
        #expect(second != first)
        // Killed while idle: the next read finds out before sending and connects afresh.
        try admin.query("SELECT pg_terminate_backend(\(second))")
        try waitUntil {
            try admin.query("SELECT count(*) FROM pg_stat_activity WHERE pid = \(second)").single().decode(Int.self, 0) == 0
        }
        let third = try pool.read("SELECT pg_backend_pid() AS pid").single().decode(Int.self, "pid")
        #expect(third != second)
    }

    @Test("a statement is prepared again after 100 runs, so a plan made while the tables were empty is made again")
    func replans() throws {
        let pool = makePool(try TestPostgres.freshDatabase())
        let sql = "SELECT $1::int AS n"
        func prepared() throws -> Int {
            try pool.read("SELECT count(*)::int AS c FROM pg_prepared_statements WHERE statement = \(sql)").single()
                .decode(Int.self, "c")
        }
        for run in 1...100 {
            #expect(
                try pool.read(PostgresQuery(unsafeSQL: sql, binds: [.text(String(run))])).single().decode(Int.self, "n") == run)
        }
        #expect(try prepared() == 1)
        #expect(try pool.read(PostgresQuery(unsafeSQL: sql, binds: [.text("101")])).single().decode(Int.self, "n") == 101)
        #expect(try prepared() == 2, "the 101st run went out under a new name")
        #expect(pool.statistics.pipelineBatches == 103)
    }

    @Test("closing the pool fails the reads waiting for a batch and every later one; the batch in flight is answered")
    func close() throws {
        let configuration = try TestPostgres.freshDatabase()
        let pool = makePool(configuration)
        let admin = try PostgresConnection(configuration: configuration)
        try admin.query("SELECT pg_advisory_lock(42)")
        let inFlight = try blockedRead(pool, admin: admin)
        let waiting = Running { try pool.read("SELECT 1 AS n").single().decode(Int.self, "n") }
        waitUntil { pool.statistics.pipelineQueued == 1 }

        pool.close()
        #expect((waiting.wait().error as? PostgresError)?.code == .poolClosed)
        #expect((#expect(throws: PostgresError.self) { try pool.read("SELECT 1") })?.code == .poolClosed)
        try admin.query("SELECT pg_advisory_unlock(42)")
        #expect(try inFlight.wait().get() == 0)
    }

    @Test("through PgBouncer in transaction pooling a read runs as a pool query", .enabled(if: TestPgBouncer.isInstalled))
    func throughPgBouncer() throws {
        let database = try TestPostgres.freshDatabase()
        let bouncer = try TestPgBouncer(database: database, poolSize: 2)
        let pool = makePool(try PostgresConfiguration(connectionString: try bouncer.url(for: database)))
        for expected in 1...3 {
            #expect(try pool.read("SELECT \(expected)::int AS n").single().decode(Int.self, "n") == expected)
        }
        let statistics = pool.statistics
        #expect(statistics.pipelinedReads == 0 && statistics.statements == 3, "\(statistics)")
    }
}

extension Result {
    fileprivate var error: Failure? {
        if case .failure(let error) = self { error } else { nil }
    }
}
