import Dispatch
import Foundation
import Synchronization

/// Runs `body(0..<count)` on `count` threads of their own at once and waits for all.
/// Tests use it for real concurrency on blocking code (the pool, HTTP), which must not
/// run on Swift concurrency's small cooperative pool.
public func onThreads<T: Sendable>(_ count: Int, _ body: @escaping @Sendable (Int) throws -> T) -> [Result<T, any Error>] {
    let results = Mutex<[Int: Result<T, any Error>]>([:])
    let group = DispatchGroup()
    for index in 0..<count {
        group.enter()
        Thread {
            let result = Result { try body(index) }
            results.withLock { $0[index] = result }
            group.leave()
        }.start()
    }
    group.wait()
    return results.withLock { all in (0..<count).map { all[$0]! } }
}
