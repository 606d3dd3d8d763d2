import Dispatch
import Locking
import Synchronization

/// A level-triggered wake-up: `signal()` makes the next (or current) `wait` return at once.
/// Workers wait on it between polls of their queue; NOTIFY handlers and local producers signal it.
public final class WakeupSignal: Sendable {
    private let pending = Lock(false)
    private let semaphore = DispatchSemaphore(value: 0)

    public init() {}

    /// Wakes one waiter now or the next one to wait.
    public func signal() {
        let wasPending = pending.withLock { pending in
            defer { pending = true }
            return pending
        }
        if !wasPending { semaphore.signal() }
    }

    /// Waits until signalled or `timeout` passes; true when signalled.
    @discardableResult
    public func wait(timeout: Duration) -> Bool {
        let signalled = semaphore.wait(timeout: .now() + timeout.dispatchInterval) == .success
        pending.withLock { $0 = false }
        return signalled
    }
}
