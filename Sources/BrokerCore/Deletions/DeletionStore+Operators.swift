import Foundation
import PostgresClient

/// What operators read and note about deletion requests beyond the API's record (the console
/// asks `DeletionService`, never the tables): queue figures, the receipt, ticket and deadline
/// extension (sql/0018), the evidence of a completed deletion and the follow-up queues
/// (docs/console.md). Each write is audited in its own transaction.
extension DeletionStore {
    /// The queue at a glance.
    package struct Figures: Sendable {
        package var backlog = 0
        package var failed = 0
        package var oldestPendingSeconds: Double = 0
    }

    package func figures() throws -> Figures {
        let row = try pool.query(
            """
            SELECT count(*) FILTER (WHERE state IN ('requested', 'revoking', 'purging')) AS backlog,
                   count(*) FILTER (WHERE state = 'failed') AS failed,
                   COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE state IN ('requested', 'revoking', 'purging'))), 0)::float8 AS oldest
            FROM deletion_requests
            """
        ).single()
        return Figures(
            backlog: try row.decode(Int.self, "backlog"), failed: try row.decode(Int.self, "failed"),
            oldestPendingSeconds: try row.decode(Double.self, "oldest"))
    }

    /// The receipt, ticket and deadline extension of a request (sql/0018).
    package struct Annotation: Sendable {
        package var receivedAt: Date?
        package var ticket: String?
        package var extendedUntil: Date?
        package var extensionReason: String?
    }

    package func annotations(_ ids: [UUID]) throws -> [UUID: Annotation] {
        guard !ids.isEmpty else { return [:] }
        var result: [UUID: Annotation] = [:]
        for row in try pool.query(
            """
            SELECT id, received_at, ticket, extended_until, extension_reason FROM deletion_requests
            WHERE id = ANY (\(PostgresTextArray(ids.map(\.lowercasedString)))::uuid[])
            """)
        {
            result[try row.decode(UUID.self, "id")] = Annotation(
                receivedAt: try row.decode(Date?.self, "received_at"), ticket: try row.decode(String?.self, "ticket"),
                extendedUntil: try row.decode(Date?.self, "extended_until"),
                extensionReason: try row.decode(String?.self, "extension_reason"))
        }
        return result
    }

    /// Records a new request's receipt and ticket (once), with `audit` (its deletion id set here).
    func annotate(_ id: UUID, receivedAt: Date, ticket: String, audit: AuditLog.Record) throws {
        try pool.withTransaction { connection in
            try connection.query(
                "UPDATE deletion_requests SET received_at = \(receivedAt), ticket = \(ticket) WHERE id = \(id) AND received_at IS NULL"
            )
            try AuditLog.append(audit.about(deletion: id), on: connection)
        }
    }

    /// Moves the due date to `until` when `DeletionDeadline` allows it (after the first
    /// month, at most 90 days after receipt) and the request is not done, audited; false otherwise.
    func extend(_ id: UUID, until: Date, reason: String, audit: AuditLog.Record) throws -> Bool {
        try pool.withTransaction { connection in
            let rows = try connection.query(
                """
                UPDATE deletion_requests SET extended_until = \(until), extension_reason = \(reason)
                WHERE id = \(id) AND state <> 'done'
                  AND \(until)::timestamptz <= COALESCE(received_at, created_at) + \(DeletionDeadline.extendedAtMost)::interval
                  AND \(until)::timestamptz > COALESCE(received_at, created_at) + \(DeletionDeadline.answerWithin)::interval
                """)
            guard rows.affectedRows == 1 else { return false }
            try AuditLog.append(audit.about(deletion: id), on: connection)
            return true
        }
    }

    /// When the purge ran, from the tombstone it left.
    package func purgedAt(deletionID: UUID) throws -> Date? {
        try pool.query("SELECT max(deleted_at) AS at FROM tombstones WHERE deletion_id = \(deletionID)").first?.decode(
            Date?.self, "at")
    }

    /// A completed deletion Apple had no token for (TN3194): the user must revoke in Settings.
    package struct ManualRevocation: Sendable {
        package var deletionID: UUID
        /// The app group left to the user (its primary App ID); nil for a deletion the previous
        /// release decided, which knew no groups.
        package var appID: String?
        package var completedAt: Date?
        /// When Apple said the user stopped using the group (`consent-revoked`) or deleted the
        /// account (`account-delete`), or the deletion was a dormant user's: closed for good.
        package var closedAt: Date?
        package var closedBy: String?
    }

    /// TN3194 follow-ups, the newest 200: each app group a completed deletion had no live token
    /// for, whose user must stop using Sign in with Apple for it in Settings. Their closure is
    /// recorded when the closing notification arrives (`deletion_app_groups`,
    /// broker_close_follow_ups), so pruning the inbox never reopens one. A deletion the previous
    /// release decided has no groups: its closure is still read from the inbox (any
    /// consent-revoked or account-delete for the same keyed sub hash, as that release did; both
    /// hashes are `SubjectHasher`'s keyed HMAC of the sub).
    package func manualRevocations() throws -> [ManualRevocation] {
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
    package func legacyFollowUpClosedAt(deletionID: UUID) throws -> Date? {
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

    /// The last revocation step of a failed deletion for one client id, when it did not revoke.
    package struct FailedRevocation: Sendable {
        package var deletionID: UUID
        package var clientID: String?
        package var outcome: String
        package var at: Date
    }

    package func failedRevocations() throws -> [FailedRevocation] {
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

    /// An Apple notification about a sub after the broker deleted it (matched by keyed hash).
    package struct LateNotification: Sendable {
        package var deletionID: UUID
        package var eventType: String
        package var outcome: String
        package var receivedAt: Date
    }

    package func notificationsAfterDeletion() throws -> [LateNotification] {
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
}
