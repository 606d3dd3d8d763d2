import BrokerCrypto
import Foundation
import PostgresClient
import StrictJSON

/// The rows behind web sign-in (sql/0006, 0010): the states already used, and one-time
/// result codes, both stored as SHA-256 hashes of the secrets handed out. Authorization
/// requests themselves are stored nowhere (`WebSignInState` carries them).
package struct WebSignInStore: Sendable {
    let pool: PostgresPool

    package init(pool: PostgresPool) { self.pool = pool }

    /// Remembers `state` as used until it expires; false when it was used already.
    package func markUsed(state: String, expiresAt: Int) throws -> Bool {
        let rows = try pool.query(
            """
            INSERT INTO web_used_states (state_hash, expires_at) VALUES (\(SHA256.hexHash(state)), to_timestamp(\(expiresAt)))
            ON CONFLICT (state_hash) DO NOTHING RETURNING true
            """)
        return !rows.isEmpty
    }

    /// Deletes expired result codes and used states past their expiry (an expired state is
    /// refused on its expiry alone).
    static func prune(_ pool: PostgresPool) throws {
        try pool.query("DELETE FROM web_results WHERE expires_at < now()")
        try pool.query("DELETE FROM web_used_states WHERE expires_at < now()")
    }

    /// Stores a login answer under a new one-time code and returns the code. The row belongs
    /// to the user and goes with them.
    func createResult(_ response: JSONValue, clientID: String, userID: String, lifetime: Duration) throws -> String {
        let code = Base64URL.encode(SecureRandom.bytes(32))
        try pool.query(
            """
            INSERT INTO web_results (code_hash, client_id, user_id, response, expires_at)
            VALUES (\(SHA256.hexHash(code)), \(clientID), \(userID)::uuid,
                    \(String(decoding: response.serialized(), as: UTF8.self))::jsonb,
                    now() + \(lifetime)::interval)
            """)
        return code
    }

    /// The client id a result code was issued for, without redeeming it.
    func clientID(ofResult code: String) throws -> String? {
        try pool.query("SELECT client_id FROM web_results WHERE code_hash = \(SHA256.hexHash(code))").first?.decode(
            String.self, "client_id")
    }

    /// The login answer for a result code, which is deleted: nil when unknown, used or expired.
    func redeem(_ code: String) throws -> JSONValue? {
        let rows = try pool.query(
            "DELETE FROM web_results WHERE code_hash = \(SHA256.hexHash(code)) RETURNING response::text AS response, expires_at > now() AS live"
        )
        guard let row = rows.first, try row.decode(Bool.self, "live") else { return nil }
        return try JSONValue.parse(Array(try row.decode(String.self, "response").utf8))
    }
}
