import Glibc
import Locking
import Synchronization

/// A token bucket per key (an API key id, a client address): `rate` requests per second on
/// average, bursts up to `burst`. A refusal says how long to wait.
public final class RateLimiter: Sendable {
    public let rate: Double
    public let burst: Double
    private let buckets = Lock<[String: (tokens: Double, updated: ContinuousClock.Instant)]>([:])
    /// Bounds memory when keys are many (a scan of addresses). At the bound the buckets that
    /// cost least to forget go first: forgetting one gives its key a full bucket, so those
    /// nearest full are dropped, never the whole table (one flood must not reset the budget
    /// of the addresses it was meant to limit).
    let maximumKeys: Int

    /// - Parameters:
    ///   - rate: sustained requests per second; 0 disables the limiter.
    ///   - burst: the bucket size (at least 1).
    ///   - maximumKeys: the most keys remembered (about 100 bytes each).
    public init(rate: Double, burst: Double, maximumKeys: Int = 100_000) {
        self.rate = rate
        self.burst = max(1, burst)
        self.maximumKeys = max(10, maximumKeys)
    }

    /// The key for a client address: IPv4 as is, IPv6 by its /64 (one subscriber's
    /// allocation: a host picks new addresses within it at will), IPv4-mapped IPv6 as IPv4.
    public static func addressKey(_ address: String) -> String {
        guard address.contains(":") else { return address }
        var bytes = in6_addr()
        guard inet_pton(AF_INET6, address, &bytes) == 1 else { return address }
        let octets = withUnsafeBytes(of: bytes) { Array($0) }
        if octets[0..<10].allSatisfy({ $0 == 0 }) && octets[10] == 0xff && octets[11] == 0xff {
            return octets[12...].map(String.init).joined(separator: ".")
        }
        let hex = octets[0..<8].map { String($0, radix: 16) }.map { $0.count == 1 ? "0" + $0 : $0 }.joined()
        return hex + "::/64"
    }

    /// Keys remembered right now.
    public var keyCount: Int { buckets.withLock { $0.count } }

    public var isEnabled: Bool { rate > 0 }

    /// Takes one token for `key`; nil when allowed, otherwise the seconds to wait.
    public func acquire(_ key: String) -> Int? {
        guard isEnabled else { return nil }
        let now = ContinuousClock.now
        return buckets.withLock { buckets in
            if buckets.count >= maximumKeys { evict(&buckets, now: now) }
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

    /// Gives back the token `acquire` took for `key` (up to `burst`): for budgets against
    /// guessing, which an attempt that proved right should not spend.
    public func refund(_ key: String) {
        guard isEnabled else { return }
        buckets.withLock { buckets in
            guard var bucket = buckets[key] else { return }
            bucket.tokens = min(burst, bucket.tokens + 1)
            buckets[key] = bucket
        }
    }

    /// Drops the cheapest tenth of the table: the buckets that would hold most tokens now.
    private func evict(
        _ buckets: inout [String: (tokens: Double, updated: ContinuousClock.Instant)], now: ContinuousClock.Instant
    ) {
        func projected(_ bucket: (tokens: Double, updated: ContinuousClock.Instant)) -> Double {
            let elapsed = now - bucket.updated
            return min(
                burst, bucket.tokens + (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18) * rate
            )
        }
        let keep = maximumKeys * 9 / 10
        let ranked = buckets.map { ($0.key, projected($0.value)) }.sorted { $0.1 > $1.1 }
        for (key, _) in ranked.prefix(buckets.count - keep) { buckets.removeValue(forKey: key) }
    }

    /// Throws 429 `rate_limited` with `Retry-After` when `key` is over its budget.
    public func check(_ key: String, what: String) throws {
        if let wait = acquire(key) {
            throw Problem(
                status: 429, code: "rate_limited", title: "Too many requests",
                detail: "\(what) is over its request rate; retry later", headers: ["Retry-After": String(wait)])
        }
    }

    /// Throws 429 when the client address (IPv6 by /64) is over its budget.
    public func check(address: String) throws {
        try check(Self.addressKey(address), what: "this address")
    }
}
