import Synchronization

/// A token bucket per key (an API key id, a client address): `rate` requests per second on
/// average, bursts up to `burst`. A refusal says how long to wait.
public final class RateLimiter: Sendable {
    public let rate: Double
    public let burst: Double
    private let buckets = Mutex<[String: (tokens: Double, updated: ContinuousClock.Instant)]>([:])
    /// Bounds memory when keys are many (a scan of addresses): the table is cleared, which only
    /// ever errs towards letting requests through.
    private let maximumKeys = 100_000

    /// - Parameters:
    ///   - rate: sustained requests per second; 0 disables the limiter.
    ///   - burst: the bucket size (at least 1).
    public init(rate: Double, burst: Double) {
        self.rate = rate
        self.burst = max(1, burst)
    }

    public var isEnabled: Bool { rate > 0 }

    /// Takes one token for `key`; nil when allowed, otherwise the seconds to wait.
    public func acquire(_ key: String) -> Int? {
        guard isEnabled else { return nil }
        let now = ContinuousClock.now
        return buckets.withLock { buckets in
            if buckets.count >= maximumKeys { buckets.removeAll() }
            var bucket = buckets[key] ?? (burst, now)
            let elapsed = now - bucket.updated
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            bucket.tokens = min(burst, bucket.tokens + seconds * rate)
            bucket.updated = now
            defer { buckets[key] = bucket }
            if bucket.tokens >= 1 {
                bucket.tokens -= 1
                return nil
            }
            return max(1, Int(((1 - bucket.tokens) / rate).rounded(.up)))
        }
    }

    /// Throws 429 `rate_limited` with `Retry-After` when `key` is over its budget.
    public func check(_ key: String, what: String) throws {
        if let wait = acquire(key) {
            throw Problem(
                status: 429, code: "rate_limited", title: "Too many requests",
                detail: "\(what) is over its request rate; retry later", headers: ["Retry-After": String(wait)])
        }
    }
}
