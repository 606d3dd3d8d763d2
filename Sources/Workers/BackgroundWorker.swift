import Foundation
import Locking
import Observability
import Synchronization

/// A loop on a thread of its own (blocking calls to PostgreSQL and Apple belong on threads
/// we own, not on Swift concurrency's cooperative pool).
///
/// `step` does one batch of work and says whether there may be more: the loop runs it
/// again at once while it finds work, and otherwise sleeps until `interval` passes or
/// `wake()` is called (a NOTIFY handler or a local producer). Errors are logged and the
/// loop backs off (`failureBackoff`); it never dies.
public final class BackgroundWorker: Sendable {
    public let name: String
    private let interval: Duration
    private let step: @Sendable () throws -> Bool
    private let signal = WakeupSignal()
    private let stopped = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)
    private let started = Atomic<Bool>(false)
    private let logger: Logger
    /// Called when a step found work (a group uses it to wake its next lane).
    private let foundWork: @Sendable () -> Void

    public init(
        name: String, interval: Duration, logger: Logger, foundWork: @escaping @Sendable () -> Void = {},
        step: @escaping @Sendable () throws -> Bool
    ) {
        self.name = name
        self.interval = interval
        self.step = step
        self.foundWork = foundWork
        self.logger = logger.labelled(name)
    }

    /// Starts the thread (once).
    public func start() {
        guard !started.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let thread = Thread { [self] in
            run()
            finished.signal()
        }
        thread.name = name
        thread.start()
    }

    /// Asks the loop to look for work now.
    public func wake() { signal.signal() }

    /// Stops after the current step; waits up to `timeout` for it.
    public func stop(timeout: Duration = .seconds(10)) {
        stopped.store(true, ordering: .releasing)
        signal.signal()
        if started.load(ordering: .acquiring) {
            _ = finished.wait(timeout: .now() + timeout.dispatchInterval)
        }
    }

    public var isStopped: Bool { stopped.load(ordering: .acquiring) }

    /// Asks the loop to stop without waiting (a group stops all lanes, then waits).
    func stopSignal() {
        stopped.store(true, ordering: .releasing)
        signal.signal()
    }

    /// The pause after failed steps: 0.2 s, doubling, at most 30 s.
    static let failureBackoff = Backoff(first: .milliseconds(200), maximum: .seconds(30), jitter: .none)

    private func run() {
        var failures = 0
        while !isStopped {
            do {
                let more = try step()
                failures = 0
                if more {
                    foundWork()
                    continue
                }
                signal.wait(timeout: interval)
            } catch {
                failures += 1
                let backoff = Self.failureBackoff.delay(after: failures)
                logger.warning(
                    "worker step failed", [("error", "\(error)"), ("retry_in_s", String(format: "%.1f", backoff.seconds))])
                signal.wait(timeout: backoff)
            }
        }
    }
}

extension Duration {
    package var dispatchInterval: DispatchTimeInterval {
        let (seconds, attoseconds) = components
        return .nanoseconds(Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000))
    }

    /// The duration in seconds as a Double.
    package var seconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}

/// Several `BackgroundWorker`s running the same step: each lane is a thread of its own, so
/// `lanes` blocking calls (to Apple, say) can be in flight at once. Lanes claim their own
/// work (`FOR UPDATE SKIP LOCKED`), so they never share an item.
///
/// `wake()` wakes one lane, and a lane that finds work wakes the next: one new item costs
/// one or two claims, not one per lane, while a backlog still has every lane busy within
/// a few steps.
public final class WorkerGroup: Sendable {
    let lanes: [BackgroundWorker]
    private let ring = LaneRing()
    private let next = Atomic<Int>(0)

    public init(name: String, lanes: Int, interval: Duration, logger: Logger, step: @escaping @Sendable () throws -> Bool) {
        let count = max(1, lanes)
        let ring = self.ring
        self.lanes = (0..<count).map { index in
            BackgroundWorker(
                name: "\(name)-\(index)", interval: interval, logger: logger,
                foundWork: { ring.wake((index + 1) % count) }, step: step)
        }
        ring.set(self.lanes)
    }

    public func start() { lanes.forEach { $0.start() } }

    /// Wakes one lane (round robin); it wakes others if it finds work.
    public func wake() {
        ring.wake(next.wrappingAdd(1, ordering: .relaxed).oldValue % lanes.count)
    }

    public func stop() {
        lanes.forEach { $0.stopSignal() }
        lanes.forEach { $0.stop() }
        ring.set([])  // the lanes' closures hold the ring: break the cycle
    }
}

/// The lanes of a group, for lanes to wake one another.
private final class LaneRing: Sendable {
    private let lanes = Lock<[BackgroundWorker]>([])

    func set(_ workers: [BackgroundWorker]) { lanes.withLock { $0 = workers } }

    func wake(_ index: Int) {
        let lane = lanes.withLock { $0.indices.contains(index) ? $0[index] : nil }
        lane?.wake()
    }
}
