import Dispatch
import EmbeddedPostgres
import Foundation
import Locking
import Observability
import PostgresClient
import Synchronization
import TestSupport
import Testing
import Workers

@Suite("PostgresPool", .offPool)
struct PostgresPoolTests {
    private func makePool(_ configuration: PostgresConfiguration, size: Int = 4, timeout: Duration = .seconds(5))
        -> PostgresPool
    {
        var poolConfiguration = PostgresPool.Configuration(connection: configuration, maximumConnections: size)
        poolConfiguration.acquireTimeout = timeout
        return PostgresPool(configuration: poolConfiguration)
    }

    struct Boom: Error {}

    @Test("a transaction whose body throws is rolled back")
    func rollbackOnThrow() throws {
        let pool = makePool(try TestPostgres.freshDatabase())
        try pool.query("CREATE TABLE t (n int)")
        #expect(throws: Boom.self) {
            try pool.withTransaction { connection in
                try connection.query("INSERT INTO t VALUES (1)")
                throw Boom()
            }
        }
        #expect(try pool.query("SELECT count(*) FROM t").single().decode(Int.self, 0) == 0)
        try pool.withTransaction { try $0.query("INSERT INTO t VALUES (2)") }
        #expect(try pool.query("SELECT count(*) FROM t").single().decode(Int.self, 0) == 1)
    }

    @Test("a failed statement rolls the whole transaction back and the connection stays usable")
    func failedStatementRollsBack() throws {
        let pool = makePool(try TestPostgres.freshDatabase(), size: 1)
        try pool.query("CREATE TABLE t (n int PRIMARY KEY)")
        let error = #expect(throws: PostgresError.self) {
            try pool.withTransaction { connection in
                try connection.query("INSERT INTO t VALUES (1)")
                try connection.query("INSERT INTO t VALUES (1)")
            }
        }
        #expect(error?.isUniqueViolation == true)
        #expect(try pool.query("SELECT count(*) FROM t").single().decode(Int.self, 0) == 0)
    }

    @Test("acquire times out when every connection is busy")
    func acquireTimeout() throws {
        let pool = makePool(try TestPostgres.freshDatabase(), size: 1, timeout: .milliseconds(200))
        let holding = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let thread = Thread {
            try? pool.withConnection { _ in
                holding.signal()
                release.wait()
            }
        }
        thread.start()
        holding.wait()
        let started = Date()
        let error = #expect(throws: PostgresError.self) { try pool.query("SELECT 1") }
        #expect(error?.code == .poolTimeout)
        #expect(error?.isUnavailable == true)
        #expect(Date().timeIntervalSince(started) >= 0.15)
        #expect(pool.statistics.open == 1)
        release.signal()
        #expect(try pool.query("SELECT 1").single().decode(Int.self, 0) == 1)
    }

    @Test("never opens more connections than its maximum under concurrent load")
    func bounded() throws {
        let pool = makePool(try TestPostgres.freshDatabase(), size: 3)
        let results = onThreads(40) { _ in try pool.query("SELECT pg_sleep(0.01)") }
        #expect(results.allSatisfy { (try? $0.get()) != nil })
        #expect(pool.statistics.open <= 3)
        let backends = try pool.query(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        ).single().decode(Int.self, 0)
        #expect(backends <= 3)
    }

    @Test("a serialization failure is retried until the transaction commits")
    func retriesSerializationFailures() throws {
        let pool = makePool(try TestPostgres.freshDatabase(), size: 4)
        try pool.query("CREATE TABLE counter (n int)")
        try pool.query("INSERT INTO counter VALUES (0)")
        let firstRead = DispatchSemaphore(value: 0)
        let otherCommitted = DispatchSemaphore(value: 0)
        let attempts = Atomic<Int>(0)
        // The first attempt reads, waits until another transaction has updated the row and
        // committed, then updates it too: PostgreSQL must abort it with 40001.
        let slow = Thread {
            try? pool.withTransaction(isolation: .serializable) { connection in
                let attempt = attempts.add(1, ordering: .relaxed).newValue
                let n = try connection.query("SELECT n FROM counter").single().decode(Int.self, 0)
                if attempt == 1 {
                    firstRead.signal()
                    otherCommitted.wait()
                }
                try connection.query("UPDATE counter SET n = \(n + 1)")
            }
        }
        slow.start()
        firstRead.wait()
        try pool.withTransaction(isolation: .serializable) { connection in
            try connection.query("UPDATE counter SET n = n + 1")
        }
        otherCommitted.signal()
        func current() throws -> Int { try pool.query("SELECT n FROM counter").single().decode(Int.self, 0) }
        for _ in 0..<500 where try current() < 2 {
            Thread.sleep(forTimeInterval: 0.01)
        }
        #expect(attempts.load(ordering: .relaxed) == 2, "the first attempt failed with 40001 and was retried")
        #expect(try pool.query("SELECT n FROM counter").single().decode(Int.self, 0) == 2, "no lost update")
    }

    @Test("recovers by itself after the PostgreSQL server restarts mid-run")
    func recoversAfterRestart() throws {
        let cluster = try TestPostgres.dedicatedCluster()
        defer { try? cluster.stop() }
        let pool = makePool(cluster.connectionConfiguration, size: 4, timeout: .seconds(2))
        try pool.query("CREATE TABLE IF NOT EXISTS t (n int)")
        // Warm the pool with several idle connections (eight threads at once; Dispatch's
        // concurrentPerform would run only as many as there are cores).
        _ = onThreads(8) { _ in try pool.query("SELECT pg_sleep(0.05)") }
        #expect(pool.statistics.idle >= 2)

        try cluster.stop()
        let down = #expect(throws: PostgresError.self) { try pool.query("SELECT 1") }
        #expect(down?.isUnavailable == true)

        try cluster.start()
        // The first call after the restart already succeeds: dead idle connections are
        // noticed before use and replaced.
        try pool.withTransaction { try $0.query("INSERT INTO t VALUES (1)") }
        #expect(try pool.query("SELECT count(*) FROM t").single().decode(Int.self, 0) == 1)
    }

    @Test("a transaction whose connection is killed before COMMIT is retried on a new connection")
    func retriesAfterLostConnection() throws {
        let configuration = try TestPostgres.freshDatabase()
        let pool = makePool(configuration, size: 2)
        let admin = try PostgresConnection(configuration: configuration)
        try pool.query("CREATE TABLE t (n int)")
        let attempts = Atomic<Int>(0)
        try pool.withTransaction { connection in
            if attempts.add(1, ordering: .relaxed).newValue == 1 {
                try admin.query("SELECT pg_terminate_backend(\(connection.backendPID))")
            }
            try connection.query("INSERT INTO t VALUES (1)")
        }
        #expect(attempts.load(ordering: .relaxed) == 2)
        #expect(try pool.query("SELECT count(*) FROM t").single().decode(Int.self, 0) == 1)
    }

    @Test("LISTEN/NOTIFY wakes a waiter, and a reconnect wakes it too")
    func listenNotify() throws {
        let configuration = try TestPostgres.freshDatabase()
        let listener = PostgresListener(configuration: configuration, logger: .init(label: "test"))
        let payloads = Lock<[String]>([])
        let wakeup = WakeupSignal()
        listener.subscribe("jobs") { payload in
            payloads.withLock { $0.append(payload) }
            wakeup.signal()
        }
        listener.start()
        defer { listener.stop() }
        #expect(wakeup.wait(timeout: .seconds(5)), "woken once on connect")
        let sender = try PostgresConnection(configuration: configuration)
        try sender.notify(channel: "jobs", payload: "42")
        #expect(wakeup.wait(timeout: .seconds(5)))
        #expect(payloads.withLock { $0 }.contains("42"))
        #expect(!wakeup.wait(timeout: .milliseconds(100)), "no spurious wake-up")
    }
}
