import Dispatch
import Foundation
import Locking
import Observability
import Synchronization
import Workers

/// A bounded pool of PostgreSQL connections, used from ordinary (blocking) threads.
///
/// - At most `maximumConnections` exist; a caller waits up to `acquireTimeout` for one
///   and then gets `PostgresError.poolTimeout`.
/// - Connections are opened lazily and checked before reuse, so after a server restart
///   the pool reconnects by itself; while the server is down callers get an error whose
///   `isUnavailable` is true.
/// - `withTransaction` retries serialization failures and deadlocks, and retries a
///   transaction whose connection broke before COMMIT was sent.
public final class PostgresPool: Sendable {
    public struct Configuration: Sendable {
        public var connection: PostgresConfiguration
        public var maximumConnections: Int = 10
        public var acquireTimeout: Duration = .seconds(5)
        /// Attempts for a transaction that meets a serialization failure, deadlock or lost connection.
        public var maximumTransactionAttempts: Int = 5

        public init(connection: PostgresConfiguration, maximumConnections: Int = 10) {
            self.connection = connection
            self.maximumConnections = maximumConnections
        }
    }

    /// Counts of connections, for metrics.
    public struct Statistics: Sendable, Equatable {
        public var open: Int
        public var idle: Int
        public var waiting: Int
        public var maximum: Int
        /// Statements (round trips: each query, BEGIN and COMMIT) run on connections since the
        /// pool was made, counted when a connection comes back.
        public var statements: Int
        /// Acquisitions that found no connection free and waited, and their waiting in total.
        public var waits: Int
        public var waitSeconds: Double
        /// Statements sent through the read pipeline (`read`), the batches they went in (under
        /// load fewer than the statements), and those waiting for the next batch.
        public var pipelinedReads: Int
        public var pipelineBatches: Int
        public var pipelineQueued: Int
    }

    private struct State {
        var idle: [PostgresConnection] = []
        var open = 0
        var waiting = 0
        var closed = false
        var statements = 0
        var waits = 0
        var waitNanoseconds: UInt64 = 0
    }

    public let configuration: Configuration
    private let slots: DispatchSemaphore
    private let state: Lock<State>
    private let readPipeline: PostgresReadPipeline
    private let logger: Logger

    public init(configuration: Configuration, logger: Logger = Logger(label: "postgres")) {
        precondition(configuration.maximumConnections > 0)
        self.configuration = configuration
        self.slots = DispatchSemaphore(value: configuration.maximumConnections)
        self.logger = logger
        let state = Lock(State())
        self.state = state
        self.readPipeline = PostgresReadPipeline(configuration: configuration.connection) { statements in
            state.withLock { $0.statements += statements }
        }
    }

    deinit { close() }

    /// Current counts.
    public var statistics: Statistics {
        let pipeline = readPipeline.statistics
        return state.withLock {
            Statistics(
                open: $0.open, idle: $0.idle.count, waiting: $0.waiting, maximum: configuration.maximumConnections,
                statements: $0.statements, waits: $0.waits, waitSeconds: Double($0.waitNanoseconds) / 1e9,
                pipelinedReads: pipeline.statements, pipelineBatches: pipeline.batches, pipelineQueued: pipeline.queued)
        }
    }

    /// Runs `body` with a connection for the caller's exclusive use.
    @discardableResult
    public func withConnection<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        let connection = try acquire()
        defer { release(connection) }
        return try body(connection)
    }

    /// Runs one statement on any connection (autocommit).
    @discardableResult
    public func query(_ query: PostgresQuery) throws -> PostgresRows {
        try withConnection { try $0.query(query) }
    }

    /// Runs one statement that only reads, pipelined with those of concurrent callers on a
    /// connection of the pool's own (one more than `maximumConnections`, opened at the first
    /// call): a statement alone goes out at once; under load several share one round trip
    /// (`PostgresReadPipeline`). Through a pooler it runs as `query`. A statement that writes
    /// fails (the pipeline's session is read-only).
    @discardableResult
    public func read(_ query: PostgresQuery) throws -> PostgresRows {
        try readPipeline.query(query) ?? self.query(query)
    }

    /// The pause before retrying a transaction that collided (serialization failure,
    /// deadlock): up to 10 ms, doubling to 160 ms, anywhere below that.
    static let collisionBackoff = Backoff(first: .milliseconds(10), maximum: .milliseconds(160), jitter: .full)

    /// Runs `body` inside BEGIN … COMMIT; rolls back when it throws.
    ///
    /// `body` may run more than once: on a serialization failure or deadlock, and when the
    /// connection broke before COMMIT was sent (the server rolled the transaction back).
    /// It must therefore only touch the database through the connection it is given.
    /// A break *during* COMMIT is not retried: it throws `commitOutcomeUnknown`.
    @discardableResult
    public func withTransaction<T>(
        isolation: PostgresIsolationLevel = .readCommitted,
        _ body: (PostgresConnection) throws -> T
    ) throws -> T {
        var attempt = 0
        while true {
            attempt += 1
            do {
                return try withConnection { connection in
                    try connection.begin(isolation)
                    do {
                        let value = try body(connection)
                        try connection.commit()
                        return value
                    } catch {
                        connection.rollbackQuietly()
                        throw error
                    }
                }
            } catch let error as PostgresError where attempt < configuration.maximumTransactionAttempts {
                if error.isTransientTransactionFailure {
                    // Jittered backoff so colliding transactions do not collide again.
                    Thread.sleep(forTimeInterval: Self.collisionBackoff.delay(after: attempt).seconds)
                    continue
                }
                if error.code == .connectionLost {
                    continue  // The server rolled back; a fresh connection may succeed.
                }
                throw error
            }
        }
    }

    /// Closes idle connections and refuses new work; connections in use close when released.
    public func close() {
        readPipeline.close()
        let idle = state.withLock { state -> [PostgresConnection] in
            state.closed = true
            defer { state.idle.removeAll() }
            state.open -= state.idle.count
            return state.idle
        }
        _ = idle  // Released here, outside the lock: deinit calls PQfinish.
    }

    // MARK: Acquire and release

    private func acquire() throws -> PostgresConnection {
        // A free slot is taken without waiting (and without reading the clock); only a wait
        // is timed, so the tail's share of pool waits shows in the statistics.
        if slots.wait(timeout: .now()) != .success {
            let started = DispatchTime.now().uptimeNanoseconds
            state.withLock { $0.waiting += 1 }
            let acquired = slots.wait(timeout: .now() + configuration.acquireTimeout.dispatchInterval)
            let waited = DispatchTime.now().uptimeNanoseconds - started
            state.withLock {
                $0.waiting -= 1
                $0.waits += 1
                $0.waitNanoseconds += waited
            }
            guard acquired == .success else { throw PostgresError(.poolTimeout) }
        }

        while true {
            let (candidate, closed) = state.withLock { state -> (PostgresConnection?, Bool) in
                (state.idle.popLast(), state.closed)
            }
            if closed {
                slots.signal()
                throw PostgresError(.poolClosed)
            }
            guard let candidate else { break }
            if candidate.isAlive() { return candidate }
            // A dead idle connection: the server restarted or dropped us. Drop it and the
            // rest of the idle list is likely dead too, so check the next one as well.
            state.withLock { $0.open -= 1 }
        }
        do {
            let connection = try PostgresConnection(configuration: configuration.connection)
            state.withLock { $0.open += 1 }
            return connection
        } catch {
            slots.signal()
            throw error
        }
    }

    private func release(_ connection: PostgresConnection) {
        let statements = connection.takeStatementCount()
        let discarded: [PostgresConnection] = state.withLock { state in
            state.statements += statements
            if state.closed || !connection.isOpen {
                state.open -= 1
                guard !connection.isOpen else { return [connection] }
                // A broken connection usually means the server went away: drop every idle one.
                let dead = state.idle
                state.open -= dead.count
                state.idle.removeAll()
                return [connection] + dead
            }
            state.idle.append(connection)
            return []
        }
        if !discarded.isEmpty {
            logger.debug("discarding connections", [("count", String(discarded.count))])
        }
        slots.signal()
    }
}

extension Duration {
    var dispatchInterval: DispatchTimeInterval {
        let (seconds, attoseconds) = components
        return .nanoseconds(Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000))
    }
}
