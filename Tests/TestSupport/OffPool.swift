import Foundation
import Locking
import Testing

/// Runs a suite's test bodies on threads of this process's own instead of Swift concurrency's
/// cooperative pool. That pool has one thread per core (two here), and a synchronous test that
/// waits on PostgreSQL, a socket or a sleep holds one of them for its whole run, so before this
/// at most two tests ran at a time while the machine sat idle. `@Suite("…", .offPool)`.
///
/// The scope is a task-executor preference, not a thread of the test's own: the test stays in
/// its task, so task-locals (and with them `#expect`'s link to the running test) are kept.
public struct OffPoolTrait: SuiteTrait, TestTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        guard testCase != nil else { return try await function() }
        try await withTaskExecutorPreference(TestThreads.shared) { try await function() }
    }
}

extension Trait where Self == OffPoolTrait {
    /// Test bodies run on the test threads (see `OffPoolTrait`).
    public static var offPool: Self { OffPoolTrait() }
}

/// A fixed set of threads running jobs in arrival order. Their number bounds how many tests run
/// at once: each integration test starts a broker with its own connection pool, simulator and
/// threads, and the test cluster's connections are finite. `BROKER_TEST_THREADS` sets it.
final class TestThreads: TaskExecutor, @unchecked Sendable {
    static let shared = TestThreads(
        count: ProcessInfo.processInfo.environment["BROKER_TEST_THREADS"].flatMap(Int.init) ?? 6)

    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []

    init(count: Int) {
        for index in 0..<max(1, count) {
            let thread = Thread { [unowned self] in self.run() }
            thread.name = "test-\(index)"
            thread.stackSize = 8 << 20
            thread.start()
        }
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    private func run() {
        let executor = asUnownedTaskExecutor()
        while true {
            condition.lock()
            while jobs.isEmpty { condition.wait() }
            let job = jobs.removeFirst()
            condition.unlock()
            job.runSynchronously(on: executor)
        }
    }
}
