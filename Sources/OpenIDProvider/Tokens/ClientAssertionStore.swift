import BrokerCrypto
import Foundation
import PostgresClient

/// The `jti` of every client assertion accepted (sql/0024 `oidc_client_assertions`): each is
/// good once (RFC 7523 §3 item 7). One INSERT decides between two racing uses. Rows live until
/// the assertion's `exp` (at most an hour ahead: ClientAuthentication refuses longer), so the
/// table holds at most an hour of one client's successful authentications.
struct ClientAssertionStore: Sendable {
    let pool: PostgresPool

    /// Records `jti`; false when it was used before and has not expired.
    func spend(clientID: String, jti: String, expiresAt: Date) throws -> Bool {
        !(try pool.query(
            """
            INSERT INTO oidc_client_assertions (client_id, jti_hash, expires_at)
            VALUES (\(clientID), \(SHA256.hexHash(jti)), \(expiresAt))
            ON CONFLICT (client_id, jti_hash) DO UPDATE SET expires_at = excluded.expires_at
                WHERE oidc_client_assertions.expires_at < now()
            RETURNING 1
            """
        ).isEmpty)
    }

    /// Deletes expired jti records; returns how many.
    @discardableResult
    func prune() throws -> Int {
        try pool.query("DELETE FROM oidc_client_assertions WHERE expires_at < now() - interval '5 minutes' RETURNING 1").count
    }
}
