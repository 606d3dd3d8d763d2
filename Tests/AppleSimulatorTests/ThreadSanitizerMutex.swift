#if BROKER_TSAN
import ThreadSanitizerSupport

/// Under ThreadSanitizer (scripts/test-tsan.sh), this module's `Mutex` is a pthread mutex the
/// sanitizer can see; see PThreadMutex.
typealias Mutex<Value> = PThreadMutex<Value>
#endif
