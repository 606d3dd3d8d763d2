import Foundation
import PostgresClient

/// The database side of the refresh sweep (`RefreshTokenSweep` keeps the decisions): claiming
/// due tokens under a lease, recording a validation, backing a token off, putting a batch back.
package struct RefreshTokenStore: Sendable {
    let pool: PostgresPool
    /// Only this team's tokens: another team's (before a transfer) cannot be refreshed with our credentials.
    let teamID: String

    package init(pool: PostgresPool, teamID: String) {
        self.pool = pool
        self.teamID = teamID
    }

    struct DueToken: Sendable {
        var id: UUID
        var identityID: UUID
        var clientID: String
        var sealed: [UInt8]
        var keyID: String
        var teamID: String
        var sub: String
        var failures: Int
        /// The kind of its last failed validation (`apple_tokens.last_validation_error`).
        var lastError: String?
    }

    /// Claims up to `limit` due tokens of active users with `FOR UPDATE SKIP LOCKED` and leases
    /// them for ten minutes, so replicas and lanes share the work and a crashed worker's tokens
    /// come back on their own.
    func claimDue(limit: Int) throws -> [DueToken] {
        try pool.query(
            """
            WITH due AS (
                SELECT t.id FROM apple_tokens t JOIN users u ON u.id = t.user_id
                JOIN apple_identities ti ON ti.id = t.identity_id
                WHERE t.next_validation_at <= now() AND t.revoked_at IS NULL AND u.status = 'active'
                  AND ti.team_id = \(teamID)
                ORDER BY t.next_validation_at LIMIT \(limit)
                FOR UPDATE OF t SKIP LOCKED)
            UPDATE apple_tokens t SET next_validation_at = now() + interval '10 minutes'
            FROM due, apple_identities i
            WHERE t.id = due.id AND i.id = t.identity_id
            RETURNING t.id, t.identity_id, t.client_id, t.refresh_token, t.key_id, i.team_id, i.sub, t.validation_failures,
                t.last_validation_error
            """
        ).map { row in
            DueToken(
                id: try row.decode(UUID.self, "id"), identityID: try row.decode(UUID.self, "identity_id"),
                clientID: try row.decode(String.self, "client_id"), sealed: try row.decode([UInt8].self, "refresh_token"),
                keyID: try row.decode(String.self, "key_id"), teamID: try row.decode(String.self, "team_id"),
                sub: try row.decode(String.self, "sub"), failures: try row.decode(Int.self, "validation_failures"),
                lastError: try row.decode(String?.self, "last_validation_error"))
        }
    }

    /// Puts claimed tokens back as they were due (the breaker opened before they were tried).
    func release(_ ids: [UUID]) throws {
        let ids = PostgresTextArray(ids.map(\.lowercasedString))
        try pool.query("UPDATE apple_tokens SET next_validation_at = now() WHERE id = ANY (\(ids)::uuid[])")
    }

    /// Apple accepted the token: no failures, next validation in `next`.
    func recordValid(_ id: UUID, next: Duration) throws {
        try pool.query(
            """
            UPDATE apple_tokens SET last_validated_at = now(), validation_failures = 0, last_validation_error = NULL,
                next_validation_at = now() + \(next)::interval
            WHERE id = \(id)
            """)
    }

    /// One more consecutive failure (of this `kind`): `failures` in a row, next try in `delaySeconds`.
    func backOff(_ id: UUID, failures: Int, kind: String, delay: Duration) throws {
        try pool.query(
            """
            UPDATE apple_tokens SET validation_failures = \(failures), last_validation_error = \(kind),
                next_validation_at = now() + \(delay)::interval
            WHERE id = \(id)
            """)
    }

    /// A verdict of the sweep on one token (the names of sql `broker_sweep_verdict`).
    enum Verdict: String {
        case revoked
        case tokenInvalid = "token_invalid"
    }

    /// What `broker_sweep_verdict` did.
    enum Applied: String, PostgresDecodable {
        case revoked
        case alreadyRevoked = "already_revoked"
        /// A later sign-in proves the group's authorization: only this token ended.
        case superseded
        case tokenInvalid = "token_invalid"
        /// The token the verdict was about is no longer stored and live.
        case gone
    }

    /// Applies a verdict on the authorization `token` came from, by Apple's clock (sql
    /// `broker_sweep_verdict`, with its `consent.revoked` or `token.invalidated` event).
    func apply(_ verdict: Verdict, to token: DueToken, group: AppGroups.Group, appleError: String) throws -> Applied {
        try pool.query(
            """
            SELECT broker_sweep_verdict(\(token.id), \(token.sealed), \(group.primary), \(PostgresTextArray(group.clientIDs)),
                \(verdict.rawValue), \(appleError))
            """
        ).single().decode(Applied.self, 0)
    }
}
