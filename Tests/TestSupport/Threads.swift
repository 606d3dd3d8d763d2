import Dispatch
import Foundation
import Locking
import Synchronization

/// Runs `body(0..<count)` on `count` threads of their own at once and waits for all.
/// Tests use it for real concurrency on blocking code (the pool, HTTP), which must not
/// run on Swift concurrency's small cooperative pool.
public func onThreads<T: Sendable>(_ count: Int, _ body: @escaping @Sendable (Int) throws -> T) -> [Result<T, any Error>] {
    let results = Lock<[Int: Result<T, any Error>]>([:])
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

/// Polls `condition` every 50 ms until it holds or `seconds` pass; the caller asserts
/// afterwards, so a timeout shows up as that assertion failing.
public func waitUntil(seconds: Double = 20, _ condition: () throws -> Bool) rethrows {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try condition() { return }
        Thread.sleep(forTimeInterval: 0.05)
    }
}
