#if canImport(Glibc)
    import Glibc
#endif

/// A lock with the shape of `Synchronization.Mutex` (`withLock`), on a default
/// `pthread_mutex_t`: an atomic exchange when free, a plain futex wait when taken, no spinning
/// and no priority inheritance (`Lock` says why that matters here).
public final class PThreadMutex<Value>: @unchecked Sendable {
    private var value: Value
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)

    public init(_ value: Value) {
        self.value = value
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    public func withLock<Result, Failure: Error>(
        _ body: (inout Value) throws(Failure) -> Result
    ) throws(Failure) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
