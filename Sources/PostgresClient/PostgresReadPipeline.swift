import Dispatch
import Foundation
import Locking

/// Runs read-only statements of many threads on one connection of its own, pipelined: the
/// statements that arrive while a batch is at the server go together in the next one, sent
/// in one write and answered in one read (`PostgresConnection.runPipeline`).
///
/// Why: a repeat login is one short statement, and on a small machine much of its cost is
/// the wake-ups around it: the backend woken for every statement, a round trip each. Under
/// load a batch holds a few statements and the server wakes once for all of them
/// (docs/benchmarks.md, 2026-12-04).
///
/// One thread of its own sends the batches (started at the first statement). Letting the
/// caller that finds no batch in flight send it instead (leader and followers, no thread)
/// measured worse: a login then waits for another caller's thread to be scheduled and
/// hand the lead on, and throughput fell by a third. Two threads, two batches in flight,
/// measured no better than one either (docs/benchmarks.md).
///
/// - Bounds: a batch holds at most `maximumBatch` statements; callers block until answered,
///   so no more wait than there are callers' threads.
/// - Only directly connected: through a pooler in transaction mode named statements and
///   session settings are not ours, so `query` returns nil and the caller uses the pool.
/// - The session is read-only (`default_transaction_read_only`): a statement that writes
///   fails instead of writing in a batch's shared transaction.
/// - A broken connection fails the batch in flight (`connectionLost`, like a pool query) and
///   the next batch connects afresh; a dead idle connection is noticed before use.
/// - Its statements are planned again as the tables grow (`PostgresConnection.runPipeline`).
final class PostgresReadPipeline: Sendable {
    static let maximumBatch = 32

    private final class Request: Sendable {
        let query: PostgresQuery
        /// nil inside: not for this pipeline (a pooler in between), run it through the pool.
        let outcome = Lock<Result<PostgresRows, any Error>??>(nil)
        let answered = DispatchSemaphore(value: 0)
        init(_ query: PostgresQuery) { self.query = query }

        func answer(_ result: Result<PostgresRows, any Error>?) {
            outcome.withLock { $0 = .some(result) }
            answered.signal()
        }
    }

    private struct State {
        var pending: [Request] = []
        /// The thread waits for work (it must be woken).
        var sleeping = false
        var started = false
        var closed = false
        /// A pooler is in between: every statement goes through the pool.
        var bypassed = false
        var statements = 0
        var batches = 0
    }

    private let configuration: PostgresConfiguration
    private let state = Lock(State())
    private let wake = DispatchSemaphore(value: 0)
    private let countStatements: @Sendable (Int) -> Void

    init(configuration: PostgresConfiguration, countStatements: @escaping @Sendable (Int) -> Void) {
        self.configuration = configuration
        self.countStatements = countStatements
    }

    /// Statements sent, batches they went in, and statements waiting for the next batch.
    var statistics: (statements: Int, batches: Int, queued: Int) {
        state.withLock { ($0.statements, $0.batches, $0.pending.count) }
    }

    /// Runs one read-only statement in the next batch and returns its rows; nil when the
    /// statement must go through the pool instead.
    func query(_ query: PostgresQuery) throws -> PostgresRows? {
        enum Next { case bypass, start, wake, wait }
        let request = Request(query)
        let next = try state.withLock { state -> Next in
            if state.closed { throw PostgresError(.poolClosed) }
            if state.bypassed { return .bypass }
            state.pending.append(request)
            if !state.started {
                state.started = true
                return .start
            }
            defer { state.sleeping = false }
            return state.sleeping ? .wake : .wait
        }
        switch next {
        case .bypass: return nil
        case .start:
            let thread = Thread { [self] in run() }
            thread.name = "pg-pipeline"
            thread.start()
        case .wake: wake.signal()
        case .wait: break
        }
        request.answered.wait()
        guard let outcome = request.outcome.withLock({ $0 }), let result = outcome else { return nil }
        return try result.get()
    }

    /// Fails what waits and stops the thread (after its batch in flight, if one is).
    func close() {
        let waiting = state.withLock { state -> [Request] in
            state.closed = true
            defer { state.pending.removeAll() }
            return state.pending
        }
        for request in waiting { request.answer(.failure(PostgresError(.poolClosed))) }
        wake.signal()
    }

    private func run() {
        var connection: PostgresConnection?
        while true {
            let batch = state.withLock { state -> [Request]? in
                if state.closed { return nil }
                if state.pending.isEmpty {
                    state.sleeping = true
                    return []
                }
                let batch = Array(state.pending.prefix(Self.maximumBatch))
                state.pending.removeFirst(batch.count)
                return batch
            }
            guard let batch else { return }  // Closed: the connection is finished on the way out.
            if batch.isEmpty {
                wake.wait()
                continue
            }
            do {
                if let open = connection, !open.isAlive() { connection = nil }
                if connection == nil {
                    let fresh = try PostgresConnection(configuration: configuration)
                    if fresh.isPooled {
                        bypass(batch)
                        return
                    }
                    try fresh.execute("SET default_transaction_read_only = on")
                    _ = fresh.takeStatementCount()  // Setting up is not a statement of the callers'.
                    connection = fresh
                }
                let outcomes = try connection!.runPipeline(batch.map(\.query))
                let sent = connection!.takeStatementCount()
                countStatements(sent)
                state.withLock {
                    $0.statements += sent
                    $0.batches += 1
                }
                var aborted: [Request] = []
                for (request, outcome) in zip(batch, outcomes) {
                    if let outcome { request.answer(outcome) } else { aborted.append(request) }
                }
                if aborted.count == batch.count {
                    // No statement took the blame (the protocol says one does): do not loop.
                    for request in aborted { request.answer(.failure(PostgresError(.queryFailed))) }
                } else if !aborted.isEmpty {
                    // First in the next batch; unless the pool closed meanwhile (close() answered
                    // what was pending then, and nothing runs after this batch).
                    let closed = state.withLock { state -> Bool in
                        if !state.closed { state.pending.insert(contentsOf: aborted, at: 0) }
                        return state.closed
                    }
                    if closed { for request in aborted { request.answer(.failure(PostgresError(.poolClosed))) } }
                }
            } catch {
                if let connection { countStatements(connection.takeStatementCount()) }
                connection = nil
                for request in batch { request.answer(.failure(error)) }
            }
        }
    }

    /// A pooler is in between: this batch and every later statement go through the pool.
    private func bypass(_ batch: [Request]) {
        let waiting = state.withLock { state -> [Request] in
            state.bypassed = true
            defer { state.pending.removeAll() }
            return state.pending
        }
        for request in batch + waiting { request.answer(nil) }
    }
}
