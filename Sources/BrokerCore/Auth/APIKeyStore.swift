import BrokerCrypto
import Foundation
import PostgresClient
import StrictJSON

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
    /// The client ids the key may reach: exactly `clientIDs`, whatever `APPLE_APP_GROUPS`
    /// says (the default group holds every app, and widening to it made the limit a no-op);
    /// nil: every app. Set by the authenticator.
    public var reach: Set<String>? = nil
    /// The app groups (named by their primary App ID) of `reach`'s client ids: Apple keeps one
    /// grant per group, shared by its members, so a grant of one of these is the key's apps'
    /// own. nil: every group. Set by the authenticator, which knows the groups.
    public var grantReach: Set<String>? = nil

    enum CodingKeys: String, CodingKey {
        case id, name, scopes
        case createdAt = "created_at"
        case revokedAt = "revoked_at"
        case clientIDs = "client_ids"
    }

    /// Whether the key may act for `clientID` (a token's `aud`, a result's client id).
    public func reaches(_ clientID: String) -> Bool { reach?.contains(clientID) ?? true }

    /// `reach` as a SQL array, nil for an unlimited key (queries test `IS NULL` first).
    package var reachArray: PostgresTextArray? { reach.map { PostgresTextArray($0.sorted()) } }

    /// `grantReach` as a SQL array, nil for an unlimited key.
    package var grantReachArray: PostgresTextArray? { grantReach.map { PostgresTextArray($0.sorted()) } }
}

/// Creates, lists and revokes API keys. Keys look like `abk_<12-char id>_<43-char secret>`;
/// only the SHA-256 of the whole key is stored, so a leaked database cannot authenticate.
public struct APIKeyStore: Sendable {
    let pool: PostgresPool
    /// NOTIFY channel that tells every broker process to drop cached keys.
    package static let changedChannel = "api_keys_changed"

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
                connection, actor: actor, action: "api_key.created", target: "api_key:\(id)",
                detail: ["key_id": .string(id), "name": .string(name), "scopes": .string(scopeText)]
                    .merging(clientIDs.map { ["client_ids": .string($0.sorted().joined(separator: ","))] } ?? [:]) { $1 })
            return try row.decode(Date.self, "created_at")
        }
        let key = APIKey(id: id, name: name, scopes: scopes, createdAt: createdAt, revokedAt: nil, clientIDs: clientIDs?.sorted())
        return (key, secret)
    }

    /// Every key, newest first.
    public func list() throws -> [APIKey] {
        try pool.query(
            "SELECT id, name, scopes, created_at, revoked_at, array_to_string(client_ids, ',') AS client_ids FROM api_keys ORDER BY created_at DESC, id"
        ).map { try Self.key($0) }
    }

    /// Revokes a key; every running broker stops accepting it at once (NOTIFY).
    /// - Returns: false when no active key has that id.
    public func revoke(id: String, actor: String = "cli") throws -> Bool {
        try pool.withTransaction { connection in
            let rows = try connection.query(
                "UPDATE api_keys SET revoked_at = now() WHERE id = \(id) AND revoked_at IS NULL")
            guard rows.affectedRows == 1 else { return false }
            try AuditLog.record(
                connection, actor: actor, action: "api_key.revoked", target: "api_key:\(id)", detail: ["key_id": .string(id)])
            try connection.notify(channel: Self.changedChannel, payload: id)
            return true
        }
    }

    package struct Stored: Sendable {
        package let key: APIKey
        package let hash: [UInt8]
    }

    package func find(id: String) throws -> Stored? {
        guard
            let row = try pool.query(
                "SELECT id, name, scopes, created_at, revoked_at, array_to_string(client_ids, ',') AS client_ids, key_hash FROM api_keys WHERE id = \(id)"
            ).first
        else { return nil }
        return Stored(key: try Self.key(row), hash: try row.decode([UInt8].self, "key_hash"))
    }

    private static func key(_ row: PostgresRow) throws -> APIKey {
        APIKey(
            id: try row.decode(String.self, "id"), name: try row.decode(String.self, "name"),
            scopes: Scope.parseList(try row.decode(String.self, "scopes")) ?? [],
            createdAt: try row.decode(Date.self, "created_at"), revokedAt: try row.decode(Date?.self, "revoked_at"),
            clientIDs: try row.decode(String?.self, "client_ids").map { $0.split(separator: ",").map(String.init) })
    }
}
