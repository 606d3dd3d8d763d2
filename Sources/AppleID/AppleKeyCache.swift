import Dispatch
import Foundation
import JOSE
import Locking
import Observability
import StrictJSON
import Synchronization
import Workers

/// A source of Apple's signing keys by `kid` (the seam tests can replace).
public protocol AppleKeyProvider: Sendable {
    /// The verification key named `keyID`.
    /// - Throws: `AppleKeyError.unknownKey` when Apple does not publish it (after one
    ///   refetch); `.unavailable` when no key set could ever be fetched.
    func key(id keyID: String) throws -> JWK

    /// The same, for a verification of this kind: a provider that budgets refetches keeps one
    /// budget per source, so one source cannot spend another's.
    func key(id keyID: String, source: AppleKeySource) throws -> JWK
}

extension AppleKeyProvider {
    public func key(id keyID: String, source: AppleKeySource) throws -> JWK { try key(id: keyID) }
}

/// What a key is looked up for. Anyone may post to the public notification endpoint, so its
/// unknown kids must not spend the refetch a real login's new kid then needs (issue 28).
public enum AppleKeySource: String, Sendable, CaseIterable {
    case login, notification
}

public enum AppleKeyError: Error, Sendable, Equatable {
    case unknownKey
    case unavailable
}

/// Apple's JWK Set (`/auth/keys`), kept in memory.
///
/// - A verification whose key is cached makes no network call.
/// - A background thread refreshes the set every `refreshInterval`; failures keep the last
///   good set (and are retried sooner). An answer without a single usable key (an empty
///   set, or keys we cannot verify with) is a failure too: it never replaces a good set.
/// - An unknown `kid` while the last fetch failed is `.unavailable` (503), not `.unknownKey`
///   (401): Apple may have rotated to a key we could not fetch.
/// - An unknown `kid` triggers one refetch at once: one fetch in flight however many
///   requests wait on it, and at most one refetch per `refetchInterval` (10 s) and source
///   (`AppleKeySource`), so a flood of forged kids cannot hammer Apple, and one posted to the
///   public notification endpoint cannot suppress the refetch a login's new kid needs.
public final class AppleKeyCache: AppleKeyProvider {
    private struct State {
        var keys: JWKSet?
        var fetchedAt: ContinuousClock.Instant?
        /// The last refetch for an unknown kid, per source (background refreshes do not count).
        var lastRefetch: [AppleKeySource: ContinuousClock.Instant] = [:]
        var inFlight: DispatchGroup?
        /// The last fetch failed (Apple unreachable, or a set with no usable key): an unknown
        /// kid then is "retry later", not a verdict on the token (§10.9).
        var lastFetchFailed = false
    }

    private let fetch: @Sendable () throws -> JWKSet
    private let refreshInterval: Duration
    private let refetchInterval: Duration
    private let fetchTimeout: Duration
    private let state = Lock(State())
    private let logger: Logger
    private let fetches: CounterFamily
    private let worker: Lock<BackgroundWorker?> = Lock(nil)

    public init(
        refreshInterval: Duration = .seconds(900), refetchInterval: Duration = .seconds(10),
        fetchTimeout: Duration = .seconds(10),
        metrics: MetricsRegistry, logger: Logger, fetch: @escaping @Sendable () throws -> JWKSet
    ) {
        self.fetch = fetch
        self.refreshInterval = refreshInterval
        self.refetchInterval = refetchInterval
        self.fetchTimeout = fetchTimeout
        self.logger = logger
        fetches = metrics.counter("apple_jwks_fetches_total", help: "Fetches of Apple's JWK Set by outcome.", labels: ["outcome"])
        metrics.collect { [weak self] in
            guard let self else { return [] }
            let (fetchedAt, count) = state.withLock { ($0.fetchedAt, $0.keys?.keys.count ?? 0) }
            return [
                CollectedSample(
                    name: "apple_jwks_age_seconds", help: "Age of the cached JWK Set (-1: none fetched yet).",
                    value: fetchedAt.map { (ContinuousClock.now - $0).seconds } ?? -1),
                CollectedSample(name: "apple_jwks_keys", help: "Keys in the cached JWK Set.", value: Double(count)),
            ]
        }
    }

    /// Fetches now (without waiting for the result to succeed) and starts the refresher.
    public func start() {
        let worker = BackgroundWorker(name: "jwks-refresh", interval: refreshInterval, logger: logger) { [self] in
            let ok = refresh(force: true)
            if !ok { throw AppleAPIError.unavailable("JWKS refresh failed") }
            return false
        }
        self.worker.withLock { $0 = worker }
        worker.start()
    }

    public func stop() {
        worker.withLock { $0 }?.stop()
    }

    public func key(id keyID: String) throws -> JWK { try key(id: keyID, source: .login) }

    public func key(id keyID: String, source: AppleKeySource) throws -> JWK {
        if let key = state.withLock({ $0.keys?.verificationKey(keyID: keyID) }) { return key }
        _ = refresh(force: false, source: source)
        let (keys, failing) = state.withLock { ($0.keys, $0.lastFetchFailed) }
        guard let keys else { throw AppleKeyError.unavailable }
        guard let key = keys.verificationKey(keyID: keyID) else {
            throw failing ? AppleKeyError.unavailable : AppleKeyError.unknownKey
        }
        return key
    }

    /// How old the cached set is; nil before the first successful fetch.
    public var age: Duration? {
        state.withLock { $0.fetchedAt.map { ContinuousClock.now - $0 } }
    }

    /// Fetches the set unless a fetch is in flight (then waits for it) or, for a
    /// non-forced refetch, `source` attempted one within `refetchInterval`.
    /// - Returns: whether the cache now holds a set fetched by this or the joined attempt.
    @discardableResult
    func refresh(force: Bool, source: AppleKeySource = .login) -> Bool {
        let now = ContinuousClock.now
        let (group, leader) = state.withLock { state -> (DispatchGroup?, Bool) in
            if let inFlight = state.inFlight { return (inFlight, false) }
            if !force, let last = state.lastRefetch[source], now - last < refetchInterval { return (nil, false) }
            let group = DispatchGroup()
            group.enter()
            state.inFlight = group
            if !force { state.lastRefetch[source] = now }
            return (group, true)
        }
        guard let group else { return false }
        guard leader else {
            return group.wait(timeout: .now() + fetchTimeout.dispatchInterval) == .success
        }
        var succeeded = false
        do {
            let keys = try fetch()
            guard keys.keys.contains(where: \.canVerify) else {
                throw AppleAPIError.malformedResponse("the key set holds no usable key")
            }
            state.withLock {
                $0.keys = keys
                $0.fetchedAt = ContinuousClock.now
                $0.lastFetchFailed = false
            }
            fetches.increment("success")
            succeeded = true
        } catch {
            state.withLock { $0.lastFetchFailed = true }
            fetches.increment("failure")
            logger.warning("fetching Apple's keys failed; keeping the last good set", [("error", "\(error)")])
        }
        state.withLock { $0.inFlight = nil }
        group.leave()
        return succeeded
    }
}
