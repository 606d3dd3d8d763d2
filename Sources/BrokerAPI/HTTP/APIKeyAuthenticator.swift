import BrokerCore
import BrokerCrypto
import Foundation
import HTTPServer
import Locking
import Synchronization

/// Checks `Authorization: Bearer <key>` against the stored hashes.
///
/// Keys are cached for a short time so a login costs no extra query; a revocation empties
/// the cache of every process through LISTEN/NOTIFY (see `invalidate`).
public final class APIKeyAuthenticator: Sendable {
    private let store: APIKeyStore
    private let cacheTTL: Duration
    /// Per-key request budget (`BROKER_RATE_LIMIT_PER_KEY`).
    let limiter: RateLimiter
    /// Failed authentications per client address (`BROKER_RATE_LIMIT_AUTH_FAILURES_PER_IP`):
    /// an address over it gets 429 instead of 401. Only after the lookup: behind a proxy many
    /// clients share an address, and a stored valid key is never refused for their failures.
    private let failures: RateLimiter
    /// Keys found in the database; only real keys get in, so the table is as small as the key list.
    private let known = Lock<[String: (stored: APIKeyStore.Stored, expires: ContinuousClock.Instant)]>([:])
    /// Ids the database did not have, for a moment; bounded, and a flood of them empties only this.
    private let unknown = Lock<[String: ContinuousClock.Instant]>([:])
    private static let maximumUnknownIDs = 10_000
    private static let unknownTTL: Duration = .seconds(5)
    /// Names the grants (one per app group) a limited key's client ids share.
    private let groups: AppGroups

    public init(
        store: APIKeyStore, cacheTTL: Duration = .seconds(30), limiter: RateLimiter = RateLimiter(rate: 0, burst: 1),
        failures: RateLimiter = RateLimiter(rate: 0, burst: 1), groups: AppGroups = AppGroups(groups: [])
    ) {
        self.groups = groups
        self.store = store
        self.cacheTTL = cacheTTL
        self.limiter = limiter
        self.failures = failures
    }

    /// Drops every cached key (called when another process revokes one).
    /// Known ids stay known (expired, so the next use reads the database again): a key that
    /// works is never refused for its address's failures.
    public func invalidate() {
        let now = ContinuousClock.now
        known.withLock { known in
            for id in known.keys { known[id]?.expires = now }
        }
        unknown.withLock { $0.removeAll() }
    }

    /// The key presented with `request`, if it is valid and has `scope`.
    /// - Throws: `BrokerError` 401 `unauthorized` for a missing, malformed, unknown, wrong or
    ///   revoked key; 403 `insufficient_scope` when the key lacks `scope`; 429
    ///   `rate_limited` when the address has failed too often.
    public func authenticate(_ request: HTTPRequest, requiring scope: Scope) throws -> APIKey {
        guard let presented = request.bearerToken else {
            throw Self.unauthorized("send an API key as Authorization: Bearer <key>")
        }
        // abk_ + 12-character id + _ + secret
        let utf8 = Array(presented.utf8)
        guard utf8.count > 17, utf8.count <= 256, presented.hasPrefix("abk_"), utf8[16] == UInt8(ascii: "_") else {
            throw try failed(request, "the API key is malformed")
        }
        let id = String(decoding: utf8[4..<16], as: UTF8.self)
        guard let stored = try lookup(id),
            ConstantTime.equals(SHA256.hash(utf8), stored.hash),
            stored.key.revokedAt == nil
        else {
            throw try failed(request, "the API key is not valid")
        }
        guard stored.key.scopes.contains(scope) else {
            throw BrokerError(.insufficientScope, "this endpoint needs an API key with the '\(scope.rawValue)' scope")
        }
        var key = stored.key
        // Exactly the given client ids: a group is about a shared grant at Apple, not about
        // which backend may see whose users (issue 29, item 3).
        key.reach = key.clientIDs.map(Set.init)
        key.grantReach = key.clientIDs.map { Set($0.map { groups.group(of: $0).primary }) }
        return key
    }

    /// Counts a failed authentication against the address: 401, or 429 once over budget.
    private func failed(_ request: HTTPRequest, _ detail: String) throws -> BrokerError {
        try failures.check(address: request.remoteAddress)
        return Self.unauthorized(detail)
    }

    /// The middleware of a route group open only to keys with `scope`.
    public func requiring(_ scope: Scope) -> some HTTPMiddleware { Guard(authenticator: self, scope: scope) }

    /// A handler that runs only for a key with `scope` (one route outside a group).
    public func protect(
        _ scope: Scope, _ handler: @escaping @Sendable (HTTPRequest, APIKey) throws -> HTTPResponse
    ) -> HTTPHandler {
        [requiring(scope)].wrapping(authenticated(handler))
    }

    /// Authenticates the request's key for `scope`, holds it to its own budget
    /// (`BROKER_RATE_LIMIT_PER_KEY`), and hands it on as the request's identity.
    struct Guard: HTTPMiddleware {
        let authenticator: APIKeyAuthenticator
        let scope: Scope

        func handle(_ request: HTTPRequest, next: HTTPHandler) throws -> HTTPResponse {
            let key = try authenticator.authenticate(request, requiring: scope)
            try authenticator.limiter.check(key.id, what: "this API key")
            var request = request
            request.identity = key
            return try next(request)
        }
    }

    private func lookup(_ id: String) throws -> APIKeyStore.Stored? {
        let now = ContinuousClock.now
        let cached = known.withLock { $0[id] }
        if let cached, cached.expires > now { return cached.stored }
        // The no-query shortcut keys on the presented id (one the database just did not have),
        // never on the address: a key this process has not seen yet is always looked up.
        if cached == nil, let until = unknown.withLock({ $0[id] }), until > now { return nil }
        guard let stored = try store.find(id: id) else {
            known.withLock { _ = $0.removeValue(forKey: id) }
            unknown.withLock { unknown in
                if unknown.count >= Self.maximumUnknownIDs { unknown.removeAll() }
                unknown[id] = now + Self.unknownTTL
            }
            return nil
        }
        known.withLock { $0[id] = (stored, now + cacheTTL) }
        return stored
    }

    static func unauthorized(_ detail: String) -> BrokerError { BrokerError(.unauthorized, detail) }
}

/// A route's handler given the key its group's `APIKeyAuthenticator.requiring` established.
func authenticated(_ handler: @escaping @Sendable (HTTPRequest, APIKey) throws -> HTTPResponse) -> HTTPHandler {
    { request in
        // Only a route outside every key-protected group could get here without one.
        guard let key = request.identity as? APIKey else { throw APIKeyAuthenticator.unauthorized("this route needs an API key") }
        return try handler(request, key)
    }
}
