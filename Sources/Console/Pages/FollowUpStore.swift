import Foundation
import PostgresClient

/// The follow-up queues (docs/console.md, "Follow-ups"), read from what the broker keeps.
extension ConsoleStore {
    struct ManualRevocation {
        var deletionID: UUID
        var completedAt: Date?
        /// When a later `consent-revoked` or `account-delete` for the same keyed sub hash
        /// arrived: the user stopped using Sign in with Apple, the follow-up is closed.
        var closedAt: Date?
    }

    /// Completed deletions Apple had no token for (TN3194): the user must revoke in Settings.
    /// Both hashes are `SubjectHasher`'s keyed HMAC of the sub (tombstones at the purge, the
    /// inbox at receipt, unknown subjects included), so equal hashes mean the same sub.
    func manualRevocations() throws -> [ManualRevocation] {
        try pool.query(
            """
            SELECT d.id, d.completed_at,
                   (SELECT min(n.received_at) FROM apple_notifications n JOIN tombstones t ON t.sub_hash = n.sub_hash
                    WHERE t.deletion_id = d.id AND n.event_type IN ('consent-revoked', 'account-delete')
                      AND n.received_at >= d.created_at) AS closed_at
            FROM deletion_requests d
            WHERE d.apple_revocation = 'manual_required' AND d.state = 'done'
            ORDER BY d.completed_at DESC NULLS LAST LIMIT 200
            """
        ).map { row in
            ManualRevocation(
                deletionID: try row.decode(UUID.self, "id"), completedAt: try row.decode(Date?.self, "completed_at"),
                closedAt: try row.decode(Date?.self, "closed_at"))
        }
    }

    /// When the TN3194 follow-up of one deletion closed (as `manualRevocations` decides), for
    /// its evidence report; nil while it is open.
    func followUpClosedAt(deletionID: UUID) throws -> Date? {
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
