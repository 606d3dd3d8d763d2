import Dispatch
import Foundation
import Locking
import TestSupport
import Testing
import Workers

/// `Coalescer`: what arrives while a batch runs goes in the next one, at most `maximumBatch`
/// at a time, and every caller gets its own answer. The batches are made deterministic by
/// holding the first one until the others are queued (`statistics`), never by timing.
@Suite("Coalescer")
struct CoalescerTests {
    /// Submits on a thread of its own; the answer lands in `answers`, `done` is signalled.
    func submit(
        _ coalescer: Coalescer<Int, Int>, _ item: Int, into answers: Lock<[Int: Result<Int, any Error>]>,
        done: DispatchSemaphore
    ) {
        Thread.detachNewThread {
            let answer = Result { try coalescer.submit(item) }
            answers.withLock { $0[item] = answer }
            done.signal()
        }
    }

    @Test("items that arrive while a batch runs go together in the next, at most maximumBatch each, each answered with its own")
    func batches() throws {
        let gate = DispatchSemaphore(value: 0)
        let seen = Lock<[[Int]]>([])
        let coalescer = Coalescer<Int, Int>(name: "test-coalescer", maximumBatch: 3) { batch in
            seen.withLock { $0.append(batch) }
            if batch == [0] { gate.wait() }  // The first batch is held until the others queue.
            return batch.map { .success($0 * 10) }
        }
        let answers = Lock<[Int: Result<Int, any Error>]>([:])
        let done = DispatchSemaphore(value: 0)
        submit(coalescer, 0, into: answers, done: done)
        waitUntil { coalescer.statistics.inFlight == 1 }
        #expect(coalescer.statistics.inFlight == 1)
        for item in 1...5 { submit(coalescer, item, into: answers, done: done) }
        waitUntil { coalescer.statistics.queued == 5 }
        #expect(coalescer.statistics.queued == 5)
        gate.signal()
        for _ in 0...5 { #expect(done.wait(timeout: .now() + 10) == .success) }

        let results = answers.withLock { $0 }
        for item in 0...5 { #expect(try results[item]?.get() == item * 10) }
        let batches = seen.withLock { $0 }
        #expect(batches.map(\.count) == [1, 3, 2])
        #expect(Set(batches.dropFirst().joined()) == Set(1...5))
        let statistics = coalescer.statistics
        #expect(statistics.items == 6 && statistics.batches == 3 && statistics.queued == 0 && statistics.inFlight == 0)
    }

    @Test("an item its batch leaves unanswered fails instead of waiting; an idle thread ends and the next item starts one")
    func unansweredAndIdle() throws {
        let coalescer = Coalescer<Int, Int>(name: "test-coalescer", maximumBatch: 8, idleTimeout: .milliseconds(20)) {
            batch in batch.first == 0 ? [] : batch.map { .success($0 + 1) }
        }
        #expect(throws: CoalescerError.unanswered) { try coalescer.submit(0) }
        waitUntil { !coalescer.statistics.running }
        #expect(!coalescer.statistics.running)  // Idle past its timeout: the thread ended.
        let answers = Lock<[Int: Result<Int, any Error>]>([:])
        let done = DispatchSemaphore(value: 0)
        submit(coalescer, 41, into: answers, done: done)
        #expect(done.wait(timeout: .now() + 10) == .success)
        #expect(try answers.withLock { $0 }[41]?.get() == 42)
        #expect(coalescer.statistics.batches == 2)
    }
}
