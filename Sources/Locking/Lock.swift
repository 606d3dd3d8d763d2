#if BROKER_TSAN
    /// The one lock type of the code base: `Synchronization.Mutex`, or under ThreadSanitizer
    /// (`scripts/test-tsan.sh`, `-D BROKER_TSAN`) a pthread mutex the sanitizer can see
    /// (`PThreadMutex` says why). Every module uses `Lock`, never `Mutex` directly.
    public typealias Lock<Value> = PThreadMutex<Value>
#else
    import Synchronization

    /// The one lock type of the code base: `Synchronization.Mutex`, or under ThreadSanitizer
    /// (`scripts/test-tsan.sh`, `-D BROKER_TSAN`) a pthread mutex the sanitizer can see
    /// (`PThreadMutex` says why). Every module uses `Lock`, never `Mutex` directly.
    public typealias Lock<Value> = Mutex<Value>
#endif
