import BrokerCrypto
import Foundation
import PostgresClient
import StrictJSON

/// The rows behind web sign-in (sql/0006_web_signin.sql): single-use authorization states
/// and one-time result codes, both stored as SHA-256 hashes of the secrets handed out.
struct WebSignInStore: Sendable {
    let pool: PostgresPool

    /// What a consumed state said when it was created.
    struct Authorization: Sendable {
        var clientID: String
        var returnTo: String
        var appState: String?
        var rawNonce: String
    }

    /// Records a new authorization request.
    func create(
        state: String, clientID: String, returnTo: String, appState: String?, rawNonce: String, lifetimeSeconds: Int
    ) throws {
        try pool.query(
            """
            INSERT INTO web_authorizations (state_hash, client_id, return_to, app_state, raw_nonce, expires_at)
            VALUES (\(SHA256.hexHash(state)), \(clientID), \(returnTo), \(appState), \(rawNonce),
                    now() + make_interval(secs => \(lifetimeSeconds)))
            """)
    }

    /// Deletes expired result codes, and authorization rows a day past their expiry (so a
    /// replayed state is still recognised as used rather than unknown).
    static func prune(_ pool: PostgresPool) throws {
        try pool.query("DELETE FROM web_results WHERE expires_at < now()")
        try pool.query("DELETE FROM web_authorizations WHERE expires_at < now() - interval '1 day'")
    }

    /// Consumes a state once. Nil for an unknown, used or expired state.
    func consume(state: String) throws -> Authorization? {
        let rows = try pool.query(
            """
            UPDATE web_authorizations SET consumed_at = now()
            WHERE state_hash = \(SHA256.hexHash(state)) AND consumed_at IS NULL AND expires_at > now()
            RETURNING client_id, return_to, app_state, raw_nonce
            """)
        guard let row = rows.first else { return nil }
        return Authorization(
            clientID: try row.decode(String.self, 0), returnTo: try row.decode(String.self, 1),
            appState: try row.decode(String?.self, 2), rawNonce: try row.decode(String.self, 3))
    }

    /// Stores a login answer under a new one-time code and returns the code.
    func createResult(_ response: JSONValue, clientID: String, lifetimeSeconds: Int) throws -> String {
        let code = Base64URL.encode(SecureRandom.bytes(32))
        try pool.query(
            """
            INSERT INTO web_results (code_hash, client_id, response, expires_at)
            VALUES (\(SHA256.hexHash(code)), \(clientID), \(String(decoding: response.serialized(), as: UTF8.self))::jsonb,
                    now() + make_interval(secs => \(lifetimeSeconds)))
            """)
        return code
    }

    /// The login answer for a result code, which is deleted: nil when unknown, used or expired.
    func redeem(_ code: String) throws -> JSONValue? {
        let rows = try pool.query(
            "DELETE FROM web_results WHERE code_hash = \(SHA256.hexHash(code)) RETURNING response::text, expires_at > now()")
        guard let row = rows.first, try row.decode(Bool.self, 1) else { return nil }
        return try JSONValue.parse(Array(try row.decode(String.self, 0).utf8))
    }
}
