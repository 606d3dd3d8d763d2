import Foundation
import PostgresClient

/// Users the broker would otherwise keep forever: every Apple token of theirs is dead (Apple
/// answered a refresh as dead, or said the user revoked) and they have not signed in since.
/// That is all a missed `account-delete` leaves (Apple's notifications are not guaranteed,
/// protocol reference §10.7: the sweep then finds only dead tokens), so once it has lasted
/// `BROKER_DORMANT_USER_RETENTION_SECONDS` (a year by default) the user is deleted like any
/// other: a deletion request (source `cli`, requested by `retention`), the deletion job's
/// per-group decision, the purge, `user.deleted`. Nobody can be asked to stop using the app,
/// so such a deletion's TN3194 follow-ups close as `retention`.
///
/// Tokens retired by a team transfer are no evidence (the user lives on under the other
/// team); a user whose deletion failed waits for its retry. At most `batch` requests a round.
package struct DormantUsers: Sendable {
    /// `requested_by` of the deletions it opens.
    package static let actor = "retention"
    /// Deletion requests opened at most per round (every five minutes).
    package static let batch = 100

    let pool: PostgresPool
    let retention: Duration

    package init(pool: PostgresPool, retention: Duration) {
        self.pool = pool
        self.retention = retention
    }

    /// Opens deletion requests for up to `batch` dormant users; returns how many.
    @discardableResult
    package func step() throws -> Int {
        let users = try pool.query(
            """
            WITH candidates AS (
                SELECT user_id FROM apple_tokens
                WHERE revoked_reason IS NOT NULL AND revoked_reason <> 'team_transfer'
                  AND revoked_at < now() - \(retention)::interval
                UNION
                SELECT user_id FROM apple_grants WHERE consent = 'revoked' AND consent_at < now() - \(retention)::interval)
            SELECT u.id FROM users u JOIN candidates c ON c.user_id = u.id
            CROSS JOIN LATERAL (
                SELECT max(at) AS died FROM (
                    SELECT t.revoked_at AS at FROM apple_tokens t
                    WHERE t.user_id = u.id AND t.revoked_reason IS NOT NULL AND t.revoked_reason <> 'team_transfer'
                    UNION ALL
                    SELECT g.consent_at FROM apple_grants g WHERE g.user_id = u.id AND g.consent = 'revoked') AS deaths
            ) AS death
            WHERE u.status = 'active' AND death.died < now() - \(retention)::interval
              AND NOT EXISTS (SELECT 1 FROM apple_tokens t WHERE t.user_id = u.id AND t.revoked_at IS NULL)
              AND NOT EXISTS (SELECT 1 FROM apple_identities i WHERE i.user_id = u.id AND i.last_login_at > death.died)
              AND NOT EXISTS (SELECT 1 FROM deletion_requests d WHERE d.user_id = u.id AND d.state <> 'done')
            ORDER BY death.died LIMIT \(Self.batch)
            """
        ).map { try $0.decode(UUID.self, "id") }
        let reason =
            "retention: every Apple token dead and no sign-in since, for \(retention.components.seconds / 86_400) days"
        for user in users {
            // Released, and it wakes the deletion job (NOTIFY deletion_requested).
            try pool.query("SELECT * FROM broker_request_deletion_v2(\(user), 'cli', \(reason), \(Self.actor))")
        }
        return users.count
    }
}
