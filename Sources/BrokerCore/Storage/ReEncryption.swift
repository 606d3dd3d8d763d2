import BrokerCrypto
import Foundation
import PostgresClient

/// `appleid-broker reencrypt`: re-seals every secret at rest with the current (first) key
/// of `TOKEN_ENCRYPTION_KEY`, so that an older key can be removed from it: refresh and
/// access tokens, webhook signing secrets, authorization codes waiting in deletion
/// requests, and the OpenID Provider's signing keys (sql/0017; their associated data is
/// the provider's, `oidc_signing_keys|<kid>`).
///
/// Resumable and safe beside running brokers: rows are read in batches in key order, each
/// row is opened with the key it names and its associated data, and written back only if
/// it still holds the ciphertext that was read (`… AND key_id = old AND secret = old`), so a
/// row a login rewrote meanwhile is left as the login wrote it. A row that cannot be opened
/// (its key missing, or the data altered) is counted and left alone.
package struct ReEncryption: Sendable {
    package let pool: PostgresPool
    package let keys: TokenKeyRing
    package var batchSize = 500

    package init(pool: PostgresPool, keys: TokenKeyRing, batchSize: Int = 500) {
        self.pool = pool
        self.keys = keys
        self.batchSize = batchSize
    }

    /// What one kind of secret came to.
    package struct Count: Sendable, Equatable {
        package var kind: String
        package var resealed = 0
        package var unreadable = 0
        /// Rows still sealed with another key after the run (0 when the old keys can go).
        package var remaining = 0
    }

    /// One kind of sealed column: how to list candidates, how to name the associated data, how to write back.
    private struct Kind {
        var name: String
        /// Selects `id` (text), `sealed`, `key_id` and `associated_data` (text) of the rows with id > $1 sealed with another key.
        var select: (String, String) -> PostgresQuery
        var update: (String, [UInt8], String, [UInt8], String) -> PostgresQuery
        var remaining: (String) -> PostgresQuery
    }

    private var kinds: [Kind] {
        [
            Kind(
                name: "refresh_tokens",
                select: { after, current in
                    """
                    SELECT t.id::text AS id, t.refresh_token AS sealed, t.key_id,
                           'apple_tokens|' || i.team_id || '|' || i.sub || '|' || t.client_id AS associated_data
                    FROM apple_tokens t JOIN apple_identities i ON i.id = t.identity_id
                    WHERE t.key_id <> \(current) AND t.id::text > \(after) ORDER BY t.id::text LIMIT \(batchSize)
                    """
                },
                update: { id, sealed, keyID, old, oldKeyID in
                    """
                    UPDATE apple_tokens SET refresh_token = \(sealed), key_id = \(keyID)
                    WHERE id = \(id)::uuid AND key_id = \(oldKeyID) AND refresh_token = \(old)
                    RETURNING 1
                    """
                },
                remaining: { current in "SELECT count(*) AS remaining FROM apple_tokens WHERE key_id <> \(current)" }),
            Kind(
                name: "access_tokens",
                select: { after, current in
                    """
                    SELECT t.id::text AS id, t.access_token AS sealed, t.access_key_id AS key_id,
                           'apple_access_tokens|' || i.team_id || '|' || i.sub || '|' || t.client_id AS associated_data
                    FROM apple_tokens t JOIN apple_identities i ON i.id = t.identity_id
                    WHERE t.access_token IS NOT NULL AND t.access_key_id <> \(current) AND t.id::text > \(after)
                    ORDER BY t.id::text LIMIT \(batchSize)
                    """
                },
                update: { id, sealed, keyID, old, oldKeyID in
                    """
                    UPDATE apple_tokens SET access_token = \(sealed), access_key_id = \(keyID)
                    WHERE id = \(id)::uuid AND access_key_id = \(oldKeyID) AND access_token = \(old)
                    RETURNING 1
                    """
                },
                remaining: { current in
                    "SELECT count(*) AS remaining FROM apple_tokens WHERE access_token IS NOT NULL AND access_key_id <> \(current)"
                }),
            Kind(
                name: "webhook_secrets",
                select: { after, current in
                    """
                    SELECT id::text AS id, secret AS sealed, key_id, 'webhook_subscriptions|' || id::text AS associated_data FROM webhook_subscriptions
                    WHERE key_id <> \(current) AND id::text > \(after) ORDER BY id::text LIMIT \(batchSize)
                    """
                },
                update: { id, sealed, keyID, old, oldKeyID in
                    """
                    UPDATE webhook_subscriptions SET secret = \(sealed), key_id = \(keyID)
                    WHERE id = \(id)::uuid AND key_id = \(oldKeyID) AND secret = \(old)
                    RETURNING 1
                    """
                },
                remaining: { current in "SELECT count(*) AS remaining FROM webhook_subscriptions WHERE key_id <> \(current)" }),
            Kind(
                name: "deletion_codes",
                select: { after, current in
                    """
                    SELECT id::text AS id, authorization_code AS sealed, code_key_id AS key_id, 'deletion_code|' || user_id::text AS associated_data
                    FROM deletion_requests
                    WHERE authorization_code IS NOT NULL AND code_key_id <> \(current) AND id::text > \(after)
                    ORDER BY id::text LIMIT \(batchSize)
                    """
                },
                update: { id, sealed, keyID, old, oldKeyID in
                    """
                    UPDATE deletion_requests SET authorization_code = \(sealed), code_key_id = \(keyID)
                    WHERE id = \(id)::uuid AND code_key_id = \(oldKeyID) AND authorization_code = \(old)
                    RETURNING 1
                    """
                },
                remaining: { current in
                    "SELECT count(*) AS remaining FROM deletion_requests WHERE authorization_code IS NOT NULL AND code_key_id <> \(current)"
                }),
            Kind(
                name: "oidc_signing_keys",
                select: { after, current in
                    """
                    SELECT kid AS id, private_key AS sealed, key_id, 'oidc_signing_keys|' || kid AS associated_data
                    FROM oidc_signing_keys WHERE key_id <> \(current) AND kid > \(after) ORDER BY kid LIMIT \(batchSize)
                    """
                },
                update: { id, sealed, keyID, old, oldKeyID in
                    """
                    UPDATE oidc_signing_keys SET private_key = \(sealed), key_id = \(keyID)
                    WHERE kid = \(id) AND key_id = \(oldKeyID) AND private_key = \(old)
                    RETURNING 1
                    """
                },
                remaining: { current in "SELECT count(*) AS remaining FROM oidc_signing_keys WHERE key_id <> \(current)" }),
        ]
    }

    /// Re-seals everything; `progress` hears each batch.
    package func run(progress: (Count) -> Void = { _ in }) throws -> [Count] {
        let current = keys.currentKeyID
        var counts: [Count] = []
        for kind in kinds {
            var count = Count(kind: kind.name)
            var after = ""
            while true {
                let rows = try pool.query(kind.select(after, current))
                guard !rows.isEmpty else { break }
                for row in rows {
                    let id = try row.decode(String.self, "id")
                    after = id
                    let old = try row.decode([UInt8].self, "sealed")
                    let oldKeyID = try row.decode(String.self, "key_id")
                    let associatedData = Array(try row.decode(String.self, "associated_data").utf8)
                    guard let plain = try? keys.open(old, keyID: oldKeyID, associatedData: associatedData) else {
                        count.unreadable += 1
                        continue
                    }
                    let sealed = try keys.seal(plain, associatedData: associatedData)
                    if try !pool.query(kind.update(id, sealed.sealed, sealed.keyID, old, oldKeyID)).isEmpty {
                        count.resealed += 1
                    }
                }
                progress(count)
            }
            count.remaining = try pool.query(kind.remaining(current)).single().decode(Int.self, "remaining")
            counts.append(count)
        }
        return counts
    }
}
