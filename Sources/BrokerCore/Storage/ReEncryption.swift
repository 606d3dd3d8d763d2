import BrokerCrypto
import Foundation
import PostgresClient

/// Secrets another module seals with `TOKEN_ENCRYPTION_KEY` in a table of its own (the OpenID
/// Provider's signing keys): its store lists and rewrites them, and `ReEncryption` runs the
/// same loop over them as over BrokerCore's. BrokerCore declares the seam and never imports
/// the module; the command line hands the implementation over.
package protocol SealedSecrets: Sendable {
    /// The kind's name in `reencrypt`'s output (`oidc_signing_keys`).
    var kind: String { get }
    /// Up to `limit` secrets with an id above `after`, in id order, sealed with another key than `keyID`.
    func sealedBatch(after: String, notSealedWith keyID: String, limit: Int) throws -> [SealedSecret]
    /// Writes `sealed` back when the row still holds what was read; false when it changed meanwhile.
    func replace(_ secret: SealedSecret, with sealed: [UInt8], keyID: String) throws -> Bool
    /// How many are still sealed with another key than `keyID`.
    func remaining(notSealedWith keyID: String) throws -> Int
}

/// One sealed secret as read: its row's id, the ciphertext, the key that sealed it and the
/// associated data it was sealed with.
package struct SealedSecret: Sendable {
    package var id: String
    package var sealed: [UInt8]
    package var keyID: String
    package var associatedData: [UInt8]

    package init(id: String, sealed: [UInt8], keyID: String, associatedData: [UInt8]) {
        self.id = id
        self.sealed = sealed
        self.keyID = keyID
        self.associatedData = associatedData
    }
}

/// `appleid-broker reencrypt`: re-seals every secret at rest with the current (first) key
/// of `TOKEN_ENCRYPTION_KEY`, so that an older key can be removed from it: refresh and
/// access tokens, webhook signing secrets, authorization codes waiting in deletion
/// requests, and other modules' secrets (`SealedSecrets`: the OpenID Provider's signing keys).
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
    /// Other modules' secrets, after BrokerCore's own.
    package let others: [any SealedSecrets]

    package init(pool: PostgresPool, keys: TokenKeyRing, batchSize: Int = 500, others: [any SealedSecrets] = []) {
        self.pool = pool
        self.keys = keys
        self.batchSize = batchSize
        self.others = others
    }

    /// What one kind of secret came to.
    package struct Count: Sendable, Equatable {
        package var kind: String
        package var resealed = 0
        package var unreadable = 0
        /// Rows still sealed with another key after the run (0 when the old keys can go).
        package var remaining = 0
    }

    /// One kind of BrokerCore's sealed columns: how to list candidates, how to name the
    /// associated data, how to write back.
    private struct Kind: SealedSecrets {
        let pool: PostgresPool
        var kind: String
        /// Selects `id` (text), `sealed`, `key_id` and `associated_data` (text) of the rows with id > $1 sealed with another key.
        var select: @Sendable (String, String) -> PostgresQuery
        var update: @Sendable (String, [UInt8], String, [UInt8], String) -> PostgresQuery
        var count: @Sendable (String) -> PostgresQuery

        func sealedBatch(after: String, notSealedWith keyID: String, limit: Int) throws -> [SealedSecret] {
            try pool.query(select(after, keyID)).map { row in
                SealedSecret(
                    id: try row.decode(String.self, "id"), sealed: try row.decode([UInt8].self, "sealed"),
                    keyID: try row.decode(String.self, "key_id"),
                    associatedData: Array(try row.decode(String.self, "associated_data").utf8))
            }
        }

        func replace(_ secret: SealedSecret, with sealed: [UInt8], keyID: String) throws -> Bool {
            try !pool.query(update(secret.id, sealed, keyID, secret.sealed, secret.keyID)).isEmpty
        }

        func remaining(notSealedWith keyID: String) throws -> Int {
            try pool.query(count(keyID)).single().decode(Int.self, "remaining")
        }
    }

    private var kinds: [any SealedSecrets] {
        [
            Kind(
                pool: pool, kind: "refresh_tokens",
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
                count: { current in "SELECT count(*) AS remaining FROM apple_tokens WHERE key_id <> \(current)" }),
            Kind(
                pool: pool, kind: "access_tokens",
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
                count: { current in
                    "SELECT count(*) AS remaining FROM apple_tokens WHERE access_token IS NOT NULL AND access_key_id <> \(current)"
                }),
            Kind(
                pool: pool, kind: "webhook_secrets",
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
                count: { current in "SELECT count(*) AS remaining FROM webhook_subscriptions WHERE key_id <> \(current)" }),
            Kind(
                pool: pool, kind: "deletion_codes",
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
                count: { current in
                    "SELECT count(*) AS remaining FROM deletion_requests WHERE authorization_code IS NOT NULL AND code_key_id <> \(current)"
                }),
        ]
    }

    /// Re-seals everything, BrokerCore's secrets first; `progress` hears each batch.
    package func run(progress: (Count) -> Void = { _ in }) throws -> [Count] {
        let current = keys.currentKeyID
        var counts: [Count] = []
        for secrets in kinds + others {
            var count = Count(kind: secrets.kind)
            var after = ""
            while true {
                let batch = try secrets.sealedBatch(after: after, notSealedWith: current, limit: batchSize)
                guard !batch.isEmpty else { break }
                for secret in batch {
                    after = secret.id
                    guard let plain = try? keys.open(secret.sealed, keyID: secret.keyID, associatedData: secret.associatedData)
                    else {
                        count.unreadable += 1
                        continue
                    }
                    let sealed = try keys.seal(plain, associatedData: secret.associatedData)
                    if try secrets.replace(secret, with: sealed.sealed, keyID: sealed.keyID) { count.resealed += 1 }
                }
                progress(count)
            }
            count.remaining = try secrets.remaining(notSealedWith: current)
            counts.append(count)
        }
        return counts
    }
}
