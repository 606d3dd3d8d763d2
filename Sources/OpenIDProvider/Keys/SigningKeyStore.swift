import BrokerCore
import BrokerCrypto
import Foundation
import JOSE
import PostgresClient
import StrictJSON

/// The provider's RS256 keys in PostgreSQL (sql/0017), shared by every replica; private halves
/// sealed with `TOKEN_ENCRYPTION_KEY` as stored refresh tokens are.
package struct SigningKeyStore: Sendable {
    let pool: PostgresPool
    let tokenKeys: TokenKeyRing

    package init(pool: PostgresPool, tokenKeys: TokenKeyRing) {
        self.pool = pool
        self.tokenKeys = tokenKeys
    }

    /// One key as `oidc-keys list` shows it.
    package struct Summary: Sendable {
        package let kid: String
        package let state: String
        package let createdAt: Date
        package let activatesAt: Date
        package let retiredAt: Date?
    }

    /// A publishable key with its private half opened.
    struct Loaded: Sendable {
        let kid: String
        let key: AsymmetricKey
        let activatesAt: Date
    }

    /// Rotations and the first key take this transaction-scoped lock: replicas starting together make one key.
    static let lock: Int64 = 0x6f69_6463_6b65_7973

    static func associatedData(_ kid: String) -> [UInt8] { Array("oidc_signing_keys|\(kid)".utf8) }

    /// Makes the first key, signing at once, when there is none (first start).
    package func ensureKey() throws {
        if try pool.query("SELECT 1 FROM oidc_signing_keys LIMIT 1").isEmpty == false { return }
        try pool.withTransaction { connection in
            try connection.query("SELECT pg_advisory_xact_lock(\(Self.lock))")
            guard try connection.query("SELECT 1 FROM oidc_signing_keys LIMIT 1").isEmpty else { return }
            try insert(try AsymmetricKey.generateRSA(bits: 2048), activatingIn: .zero, connection)
        }
    }

    /// Publishes a new key at once; it signs after `prepublish` (RPs cache the JWKS),
    /// when the current one retires. Returns the new key's id. `actor` is audited.
    package func rotate(prepublish: Duration, actor: String = "cli") throws -> String {
        let key = try AsymmetricKey.generateRSA(bits: 2048)
        return try pool.withTransaction { connection in
            try connection.query("SELECT pg_advisory_xact_lock(\(Self.lock))")
            try connection.query(
                """
                UPDATE oidc_signing_keys SET retired_at = greatest(activates_at, now() + \(prepublish)::interval)
                WHERE retired_at IS NULL
                """)
            let kid = try insert(key, activatingIn: prepublish, connection)
            try AuditLog.record(
                connection, actor: actor, action: "oidc_signing_key.rotated",
                detail: ["target": .string(kid), "outcome": .string("rotated")])
            return kid
        }
    }

    @discardableResult
    private func insert(_ key: AsymmetricKey, activatingIn delay: Duration, _ connection: PostgresConnection) throws -> String {
        let kid = Base64URL.encode(SecureRandom.bytes(16))
        let members = try JWK(key: key, keyID: kid).publicJSON()
        let sealed = try tokenKeys.seal(Array(try key.privateKeyPEM().utf8), associatedData: Self.associatedData(kid))
        try connection.query(
            """
            INSERT INTO oidc_signing_keys (kid, public_jwk, private_key, key_id, activates_at)
            VALUES (\(kid), \(String(decoding: JSONValue.object(members).serialized(), as: UTF8.self))::jsonb,
                    \(sealed.sealed), \(sealed.keyID), now() + \(delay)::interval)
            """)
        return kid
    }

    /// Every key, newest first.
    package func list() throws -> [Summary] {
        try pool.query(
            """
            SELECT kid, created_at, activates_at, retired_at,
                   CASE WHEN activates_at > now() THEN 'pending'
                        WHEN retired_at IS NOT NULL AND retired_at <= now() THEN 'retired' ELSE 'active' END AS state
            FROM oidc_signing_keys ORDER BY activates_at DESC, created_at DESC
            """
        ).map {
            Summary(
                kid: try $0.decode(String.self, "kid"), state: try $0.decode(String.self, "state"),
                createdAt: try $0.decode(Date.self, "created_at"), activatesAt: try $0.decode(Date.self, "activates_at"),
                retiredAt: try $0.decode(Date?.self, "retired_at"))
        }
    }

    /// The keys the JWKS publishes: pending, active, and retired ones whose tokens may still be live.
    func publishable() throws -> [Loaded] {
        try pool.query(
            """
            SELECT kid, private_key, key_id, activates_at FROM oidc_signing_keys
            WHERE retired_at IS NULL OR retired_at > now() - make_interval(secs => \(ProviderPolicy.retiredKeyPublicationSeconds))
            ORDER BY activates_at DESC
            """
        ).map { row in
            let kid = try row.decode(String.self, "kid")
            let pem = try tokenKeys.open(
                try row.decode([UInt8].self, "private_key"), keyID: try row.decode(String.self, "key_id"),
                associatedData: Self.associatedData(kid))
            return Loaded(
                kid: kid, key: try AsymmetricKey.privateKey(pem: String(decoding: pem, as: UTF8.self)),
                activatesAt: try row.decode(Date.self, "activates_at"))
        }
    }
}

/// `appleid-broker reencrypt` re-seals the private halves through BrokerCore's `ReEncryption`,
/// by this store's SQL (associated data `oidc_signing_keys|<kid>`).
extension SigningKeyStore: SealedSecrets {
    package var kind: String { "oidc_signing_keys" }

    package func sealedBatch(after: String, notSealedWith keyID: String, limit: Int) throws -> [SealedSecret] {
        try pool.query(
            """
            SELECT kid, private_key, key_id FROM oidc_signing_keys
            WHERE key_id <> \(keyID) AND kid > \(after) ORDER BY kid LIMIT \(limit)
            """
        ).map { row in
            let kid = try row.decode(String.self, "kid")
            return SealedSecret(
                id: kid, sealed: try row.decode([UInt8].self, "private_key"), keyID: try row.decode(String.self, "key_id"),
                associatedData: Self.associatedData(kid))
        }
    }

    package func replace(_ secret: SealedSecret, with sealed: [UInt8], keyID: String) throws -> Bool {
        try !pool.query(
            """
            UPDATE oidc_signing_keys SET private_key = \(sealed), key_id = \(keyID)
            WHERE kid = \(secret.id) AND key_id = \(secret.keyID) AND private_key = \(secret.sealed)
            RETURNING 1
            """
        ).isEmpty
    }

    package func remaining(notSealedWith keyID: String) throws -> Int {
        try pool.query("SELECT count(*) AS remaining FROM oidc_signing_keys WHERE key_id <> \(keyID)").single().decode(
            Int.self, "remaining")
    }
}
