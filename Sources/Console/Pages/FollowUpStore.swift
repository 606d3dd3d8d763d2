import Foundation
import PostgresClient

/// The follow-up queues (docs/console.md, "Follow-ups"), read from what the broker keeps.
extension ConsoleStore {
    struct ManualRevocation {
        var deletionID: UUID
        /// The app group left to the user (its primary App ID); nil for a deletion the previous
        /// release decided, which knew no groups.
        var appID: String?
        var completedAt: Date?
        /// When Apple said the user stopped using the group (`consent-revoked`) or deleted the
        /// account (`account-delete`), or the deletion was a dormant user's: closed for good.
        var closedAt: Date?
        var closedBy: String?
    }

    /// TN3194 follow-ups: each app group a completed deletion had no live token for, whose user
    /// must stop using Sign in with Apple for it in Settings. Their closure is recorded when
    /// the closing notification arrives (`deletion_app_groups`, broker_close_follow_ups), so
    /// pruning the inbox never reopens one. A deletion the previous release decided has no
    /// groups: its closure is still read from the inbox (any consent-revoked or account-delete
    /// for the same keyed sub hash, as that release did).
    func manualRevocations() throws -> [ManualRevocation] {
        try pool.query(
            """
            SELECT * FROM (
                SELECT d.id, g.app_id, d.completed_at, g.follow_up_closed_at AS closed_at, g.follow_up_closed_by AS closed_by
                FROM deletion_app_groups g JOIN deletion_requests d ON d.id = g.deletion_id
                WHERE g.revocation = 'manual_required' AND d.state = 'done'
                UNION ALL
                SELECT d.id, NULL, d.completed_at,
                       (SELECT min(n.received_at) FROM apple_notifications n JOIN tombstones t ON t.sub_hash = n.sub_hash
                        WHERE t.deletion_id = d.id AND n.event_type IN ('consent-revoked', 'account-delete')
                          AND n.received_at >= d.created_at),
                       NULL
                FROM deletion_requests d
                WHERE d.apple_revocation = 'manual_required' AND d.state = 'done'
                  AND NOT EXISTS (SELECT 1 FROM deletion_app_groups g WHERE g.deletion_id = d.id)
            ) AS follow_ups
            ORDER BY completed_at DESC NULLS LAST, id, app_id LIMIT 200
            """
        ).map { row in
            ManualRevocation(
                deletionID: try row.decode(UUID.self, "id"), appID: try row.decode(String?.self, "app_id"),
                completedAt: try row.decode(Date?.self, "completed_at"), closedAt: try row.decode(Date?.self, "closed_at"),
                closedBy: try row.decode(String?.self, "closed_by"))
        }
    }

    /// When the TN3194 follow-up of a deletion the previous release decided (no app groups)
    /// closed, read from the inbox as it did; nil while open.
    func legacyFollowUpClosedAt(deletionID: UUID) throws -> Date? {
        try pool.query(
            """
            SELECT min(n.received_at) AS closed_at
            FROM deletion_requests d JOIN tombstones t ON t.deletion_id = d.id
            JOIN apple_notifications n ON n.sub_hash = t.sub_hash
            WHERE d.id = \(deletionID) AND n.event_type IN ('consent-revoked', 'account-delete')
              AND n.received_at >= d.created_at
            """
        ).first?.decode(Date?.self, "closed_at")
    }

    struct FailedRevocation {
        var deletionID: UUID
        var clientID: String?
        var outcome: String
        var at: Date
    }

    /// The last revocation step of each failed deletion per client id, when it did not revoke.
    func failedRevocations() throws -> [FailedRevocation] {
        try pool.query(
            """
            SELECT DISTINCT ON (s.deletion_id, s.client_id) s.deletion_id, s.client_id, s.outcome, s.at
            FROM deletion_steps s JOIN deletion_requests d ON d.id = s.deletion_id
            WHERE d.state = 'failed' AND s.step IN ('revoke', 'revoke_access_token', 'code_exchange')
            ORDER BY s.deletion_id, s.client_id, s.id DESC
            """
        ).compactMap { row in
            let outcome = try row.decode(String.self, "outcome")
            guard outcome != "revoked" && outcome != "already_invalid" else { return nil }
            return FailedRevocation(
                deletionID: try row.decode(UUID.self, "deletion_id"), clientID: try row.decode(String?.self, "client_id"),
                outcome: outcome, at: try row.decode(Date.self, "at"))
        }
    }

    struct LateNotification {
        var deletionID: UUID
        var eventType: String
        var outcome: String
        var receivedAt: Date
    }

    /// Apple notifications about a sub after the broker deleted it (matched by keyed hash).
    func notificationsAfterDeletion() throws -> [LateNotification] {
        try pool.query(
            """
            SELECT t.deletion_id, n.event_type, n.outcome, n.received_at
            FROM apple_notifications n JOIN tombstones t ON t.sub_hash = n.sub_hash
            WHERE n.received_at > t.deleted_at
            ORDER BY n.received_at DESC LIMIT 200
            """
        ).map { row in
            LateNotification(
                deletionID: try row.decode(UUID.self, "deletion_id"), eventType: try row.decode(String.self, "event_type"),
                outcome: try row.decode(String.self, "outcome"), receivedAt: try row.decode(Date.self, "received_at"))
        }
    }

    /// The identity's e-mail for an audited reveal; nil when there is none.
    func email(userID: UUID, sub: String) throws -> String? {
        try pool.query(
            """
            SELECT COALESCE(email, unverified_email) AS email FROM apple_identities
            WHERE user_id = \(userID) AND team_id = \(teamID) AND sub = \(sub)
            """
        ).first?.decode(String?.self, "email")
    }
}
