#if canImport(Glibc)
    import Glibc
#endif

/// A lock with the shape of `Synchronization.Mutex`, on `pthread_mutex_t`.
///
/// Only for ThreadSanitizer builds (`scripts/test-tsan.sh` compiles with `-D BROKER_TSAN`,
/// which makes each module's `Mutex` this type): the standard library's Mutex waits on a
/// futex inside an uninstrumented library, so ThreadSanitizer sees none of the ordering it
/// provides and reports every access it guards as a race. pthread mutexes are intercepted
/// by ThreadSanitizer, so what it reports with this lock in place is real.
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
