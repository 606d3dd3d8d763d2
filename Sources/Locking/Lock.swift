/// The one lock type of the code base; every module uses `Lock`, never a lock of its own.
///
/// It is a pthread mutex (`PThreadMutex`), not the standard library's `Synchronization.Mutex`:
/// - on Linux `Mutex` is a priority-inheritance futex that spins before it sleeps. The broker runs
///   more threads than cores on purpose (libmicrohttpd's workers block on PostgreSQL), so a
///   holder is often preempted, and its waiters then spin out their time slice and enter the
///   kernel's PI path. Under the login benchmark (`make bench-login`, 8 workers on 2 cores) its
///   slow path took 10–12% of the broker's CPU samples, from locks held for a few instructions
///   (the verify-context pool, the key cache, metrics); with a pthread mutex the broker spent
///   about a fifth less CPU per login (docs/benchmarks.md, 2026-12-04);
/// - ThreadSanitizer intercepts pthread mutexes, while `Mutex` waits on a futex inside a library
///   it does not instrument and so looks like no lock at all: the sanitized build
///   (`scripts/test-tsan.sh`) runs the very lock the release runs.
public typealias Lock<Value> = PThreadMutex<Value>
