import Dispatch
import Foundation
import Locking

/// Runs what many threads submit in batches, on one thread of its own: the items that arrive
/// while a batch runs go together in the next one, and each caller blocks until its own item
/// is answered. For work whose cost is mostly per call rather than per item, such as a
/// statement and its commit (a batch of sign-ins is one statement and one commit).
///
/// - Bounds: a batch holds at most `maximumBatch` items; callers block until answered, so no
///   more items wait than there are callers' threads.
/// - The thread starts at the first item and ends after `idleTimeout` without one (a later
///   item starts it again), so an idle coalescer holds no thread and needs no closing.
/// - `process` answers every item of its batch, in order; an item it leaves out fails
///   (`CoalescerError.unanswered`) rather than waiting forever.
public final class Coalescer<Item: Sendable, Answer: Sendable>: Sendable {
    public let maximumBatch: Int
    private let name: String
    private let idleTimeout: Duration
    private let process: @Sendable ([Item]) -> [Result<Answer, any Error>]

    private final class Request: Sendable {
        let item: Item
        let outcome = Lock<Result<Answer, any Error>?>(nil)
        let answered = DispatchSemaphore(value: 0)
        init(_ item: Item) { self.item = item }

        func answer(_ result: Result<Answer, any Error>) {
            outcome.withLock { $0 = result }
            answered.signal()
        }
    }

    private struct State {
        var pending: [Request] = []
        /// The thread waits for work (it must be woken).
        var sleeping = false
        var running = false
        var items = 0
        var batches = 0
        /// Items of the batch being processed.
        var inFlight = 0
    }

    private let state = Lock(State())
    private let wake = DispatchSemaphore(value: 0)

    /// - Parameters:
    ///   - name: the thread's name (`ps -L`, profiles).
    ///   - process: runs one batch on the coalescer's thread; returns one result per item.
    public init(
        name: String, maximumBatch: Int, idleTimeout: Duration = .seconds(1),
        process: @escaping @Sendable ([Item]) -> [Result<Answer, any Error>]
    ) {
        precondition(maximumBatch > 0)
        self.name = name
        self.maximumBatch = maximumBatch
        self.idleTimeout = idleTimeout
        self.process = process
    }

    /// Items answered, the batches they went in, items waiting for the next batch, items of
    /// the batch being processed, and whether the thread is running (it ends when idle).
    public var statistics: (items: Int, batches: Int, queued: Int, inFlight: Int, running: Bool) {
        state.withLock { ($0.items, $0.batches, $0.pending.count, $0.inFlight, $0.running) }
    }

    /// Runs `item` in the next batch and returns its answer (or throws its error).
    public func submit(_ item: Item) throws -> Answer {
        let request = Request(item)
        let next = state.withLock { state -> CoalescerNext in
            state.pending.append(request)
            if !state.running {
                state.running = true
                return .start
            }
            defer { state.sleeping = false }
            return state.sleeping ? .wake : .wait
        }
        switch next {
        case .start:
            let thread = Thread { [self] in run() }
            thread.name = name
            thread.start()
        case .wake: wake.signal()
        case .wait: break
        }
        request.answered.wait()
        guard let outcome = request.outcome.withLock({ $0 }) else { throw CoalescerError.unanswered }
        return try outcome.get()
    }

    private func run() {
        while true {
            let batch = state.withLock { state -> [Request] in
                let batch = Array(state.pending.prefix(maximumBatch))
                state.pending.removeFirst(batch.count)
                if batch.isEmpty { state.sleeping = true }
                state.inFlight = batch.count
                return batch
            }
            if batch.isEmpty {
                if wake.wait(timeout: .now() + idleTimeout.dispatchInterval) == .success { continue }
                // Idle: end, unless an item came between the timeout and the lock (it found the
                // thread running and signalled `wake`, which the next wait then consumes).
                let end = state.withLock { state -> Bool in
                    guard state.pending.isEmpty else { return false }
                    state.running = false
                    state.sleeping = false
                    return true
                }
                if end { return }
                continue
            }
            let results = process(batch.map(\.item))
            state.withLock {
                $0.items += batch.count
                $0.batches += 1
                $0.inFlight = 0
            }
            for (index, request) in batch.enumerated() {
                request.answer(index < results.count ? results[index] : .failure(CoalescerError.unanswered))
            }
        }
    }
}

/// What a submitter does after queueing its item.
private enum CoalescerNext { case start, wake, wait }

/// A batch's `process` returned fewer results than items.
public enum CoalescerError: Error, Equatable {
    case unanswered
}
