import BrokerCrypto
import Foundation
import HTTPServer
import Locking
import PostgresClient
import StrictJSON
import Synchronization

/// What an API key may do. Each endpoint requires one scope.
public enum Scope: String, Sendable, CaseIterable, Codable, Comparable {
    /// `POST /v1/apple/login` and web sign-in redemption: app backends.
    case login
    /// Reading users and credential state.
    case read
    /// Deletion requests: the compliance team.
    case compliance
    /// The pull feed of events.
    case events
    /// Webhook subscriptions and other administration.
    case admin

    public static func < (lhs: Scope, rhs: Scope) -> Bool { lhs.rawValue < rhs.rawValue }

    /// Parses `login,read`; nil if a name is unknown or the list is empty.
    public static func parseList(_ text: String) -> Set<Scope>? {
        var scopes = Set<Scope>()
        for name in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !name.isEmpty {
            guard let scope = Scope(rawValue: name) else { return nil }
            scopes.insert(scope)
        }
        return scopes.isEmpty ? nil : scopes
    }
}

/// An API key's public facts (never the key itself).
public struct APIKey: Sendable, Equatable, Codable {
    public let id: String
    public let name: String
    public let scopes: Set<Scope>
    public let createdAt: Date
    public let revokedAt: Date?
    /// The apps the key is limited to (`api-keys create --client-ids`), as given; nil: every app.
    public var clientIDs: [String]? = nil
    /// `clientIDs` widened to their app groups (what the key may reach); nil: every app.
    /// Set by the authenticator, which knows the groups.
    public var reach: Set<String>? = nil

    enum CodingKeys: String, CodingKey {
        case id, name, scopes
        case createdAt = "created_at"
        case revokedAt = "revoked_at"
        case clientIDs = "client_ids"
    }

    /// Whether the key may act for `clientID` (a token's `aud`, a result's client id).
    public func reaches(_ clientID: String) -> Bool { reach?.contains(clientID) ?? true }

    /// `reach` as a SQL array, nil for an unlimited key (queries test `IS NULL` first).
    var reachArray: PostgresTextArray? { reach.map { PostgresTextArray($0.sorted()) } }

    /// 403 `client_not_allowed`.
    static func notAllowed(_ clientID: String) -> Problem {
        Problem(
            status: 403, code: "client_not_allowed", title: "Client id not allowed",
            detail: "this API key is limited to other apps than \(clientID)")
    }
}

/// Creates, lists and revokes API keys. Keys look like `abk_<12-char id>_<43-char secret>`;
/// only the SHA-256 of the whole key is stored, so a leaked database cannot authenticate.
public struct APIKeyStore: Sendable {
    let pool: PostgresPool
    /// NOTIFY channel that tells every broker process to drop cached keys.
    static let changedChannel = "api_keys_changed"

    public init(pool: PostgresPool) { self.pool = pool }

    /// Creates a key; returns its facts and the key itself, which is shown only this once.
    public func create(
        name: String, scopes: Set<Scope>, clientIDs: [String]? = nil, actor: String = "cli"
    ) throws -> (key: APIKey, secret: String) {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567")
        let id = String(SecureRandom.bytes(12).map { alphabet[Int($0) % alphabet.count] })
        let secret = "abk_\(id)_" + Base64URL.encode(SecureRandom.bytes(32))
        let scopeText = scopes.sorted().map(\.rawValue).joined(separator: ",")
        let createdAt = try pool.withTransaction { connection in
            let row = try connection.query(
                """
                INSERT INTO api_keys (id, name, key_hash, scopes, client_ids)
                VALUES (\(id), \(name), \(SHA256.hash(secret)), \(scopeText), \(clientIDs.map { PostgresTextArray($0.sorted()) }))
                RETURNING created_at
                """
            ).single()
            try AuditLog.record(
                connection, actor: actor, action: "api_key.created",
                detail: ["key_id": .string(id), "name": .string(name), "scopes": .string(scopeText)]
                    .merging(clientIDs.map { ["client_ids": .string($0.sorted().joined(separator: ","))] } ?? [:]) { $1 })
            return try row.decode(Date.self, 0)
        }
        let key = APIKey(id: id, name: name, scopes: scopes, createdAt: createdAt, revokedAt: nil, clientIDs: clientIDs?.sorted())
        return (key, secret)
    }

    /// Every key, newest first.
    public func list() throws -> [APIKey] {
        try pool.query(
            "SELECT id, name, scopes, created_at, revoked_at, array_to_string(client_ids, ',') FROM api_keys ORDER BY created_at DESC, id"
        ).map { try Self.key($0) }
    }

    /// Revokes a key; every running broker stops accepting it at once (NOTIFY).
    /// - Returns: false when no active key has that id.
    public func revoke(id: String, actor: String = "cli") throws -> Bool {
        try pool.withTransaction { connection in
            let rows = try connection.query(
                "UPDATE api_keys SET revoked_at = now() WHERE id = \(id) AND revoked_at IS NULL")
            guard rows.affectedRows == 1 else { return false }
            try AuditLog.record(connection, actor: actor, action: "api_key.revoked", detail: ["key_id": .string(id)])
            try connection.notify(channel: Self.changedChannel, payload: id)
            return true
        }
    }

    struct Stored: Sendable {
        let key: APIKey
        let hash: [UInt8]
    }

    func find(id: String) throws -> Stored? {
        guard let row = try pool.query(
            "SELECT id, name, scopes, created_at, revoked_at, array_to_string(client_ids, ','), key_hash FROM api_keys WHERE id = \(id)"
        ).first else { return nil }
        return Stored(key: try Self.key(row), hash: try row.decode([UInt8].self, 6))
    }

    private static func key(_ row: PostgresRow) throws -> APIKey {
        APIKey(
            id: try row.decode(String.self, 0), name: try row.decode(String.self, 1),
            scopes: Scope.parseList(try row.decode(String.self, 2)) ?? [],
            createdAt: try row.decode(Date.self, 3), revokedAt: try row.decode(Date?.self, 4),
            clientIDs: try row.decode(String?.self, 5).map { $0.split(separator: ",").map(String.init) })
    }
}

/// Checks `Authorization: Bearer <key>` against the stored hashes.
///
/// Keys are cached for a short time so a login costs no extra query; a revocation empties
/// the cache of every process through LISTEN/NOTIFY (see `invalidate`).
public final class APIKeyAuthenticator: Sendable {
    private let store: APIKeyStore
    private let cacheTTL: Duration
    /// Per-key request budget (`BROKER_RATE_LIMIT_PER_KEY`).
    private let limiter: RateLimiter
    /// Failed authentications per client address (`BROKER_RATE_LIMIT_AUTH_FAILURES_PER_IP`):
    /// an address over it gets 429 for unknown key ids without a database query.
    private let failures: RateLimiter
    /// Keys found in the database; only real keys get in, so the table is as small as the key list.
    private let known = Lock<[String: (stored: APIKeyStore.Stored, expires: ContinuousClock.Instant)]>([:])
    /// Ids the database did not have, for a moment; bounded, and a flood of them empties only this.
    private let unknown = Lock<[String: ContinuousClock.Instant]>([:])
    private static let maximumUnknownIDs = 10_000
    private static let unknownTTL: Duration = .seconds(5)
    /// Widens a limited key's client ids to their app groups.
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
    /// - Throws: `Problem` 401 `unauthorized` for a missing, malformed, unknown, wrong or
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
        guard let stored = try lookup(id, from: request),
            ConstantTime.equals(SHA256.hash(utf8), stored.hash),
            stored.key.revokedAt == nil
        else {
            throw try failed(request, "the API key is not valid")
        }
        guard stored.key.scopes.contains(scope) else {
            throw Problem(
                status: 403, code: "insufficient_scope", title: "Insufficient scope",
                detail: "this endpoint needs an API key with the '\(scope.rawValue)' scope")
        }
        var key = stored.key
        key.reach = key.clientIDs.map { ids in
            Set(ids.flatMap { id in
                let group = groups.group(of: id)
                return [id, group.primary] + group.clientIDs
            })
        }
        return key
    }

    /// Counts a failed authentication against the address: 401, or 429 once over budget.
    private func failed(_ request: HTTPRequest, _ detail: String) throws -> Problem {
        try failures.check(address: request.remoteAddress)
        return Self.unauthorized(detail)
    }

    /// Wraps a handler so it runs only for a key with `scope`.
    public func protect(
        _ scope: Scope, _ handler: @escaping @Sendable (HTTPRequest, APIKey) throws -> HTTPResponse
    ) -> HTTPHandler {
        { request in
            let key = try self.authenticate(request, requiring: scope)
            try self.limiter.check(key.id, what: "this API key")
            return try handler(request, key)
        }
    }

    private func lookup(_ id: String, from request: HTTPRequest) throws -> APIKeyStore.Stored? {
        let now = ContinuousClock.now
        let cached = known.withLock { $0[id] }
        if let cached, cached.expires > now { return cached.stored }
        if cached == nil {
            if let until = unknown.withLock({ $0[id] }), until > now { return nil }
            // An id never seen from an address that keeps failing: refused without a query.
            if failures.isExhausted(RateLimiter.addressKey(request.remoteAddress)) {
                try failures.check(address: request.remoteAddress)
            }
        }
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

    static func unauthorized(_ detail: String) -> Problem {
        Problem(
            status: 401, code: "unauthorized", title: "Unauthorized", detail: detail,
            headers: ["WWW-Authenticate": "Bearer realm=\"appleid-broker\""])
    }
}
