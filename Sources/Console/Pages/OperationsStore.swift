import Foundation
import PostgresClient

/// Apple notification figures and the audit log, as the operations pages read them.
extension ConsoleStore {
    struct NotificationCount {
        var eventType: String
        var outcome: String
        var count: Int
        var last: Date
    }

    func notificationCounts() throws -> [NotificationCount] {
        try pool.query(
            """
            SELECT event_type, outcome, count(*) AS n, max(received_at) AS last FROM apple_notifications
            GROUP BY event_type, outcome ORDER BY event_type, outcome
            """
        ).map { row in
            NotificationCount(
                eventType: try row.decode(String.self, "event_type"), outcome: try row.decode(String.self, "outcome"),
                count: try row.decode(Int.self, "n"), last: try row.decode(Date.self, "last"))
        }
    }

    struct RecentNotification {
        var eventType: String
        var outcome: String
        var subjectHash: String?
        var receivedAt: Date
    }

    func recentNotifications() throws -> [RecentNotification] {
        try pool.query(
            "SELECT event_type, outcome, sub_hash, received_at FROM apple_notifications ORDER BY received_at DESC LIMIT 50"
        ).map { row in
            RecentNotification(
                eventType: try row.decode(String.self, "event_type"), outcome: try row.decode(String.self, "outcome"),
                subjectHash: try row.decode(String?.self, "sub_hash"), receivedAt: try row.decode(Date.self, "received_at"))
        }
    }

    /// A refresh token the daily sweep found dead (`invalid_grant`, `broker_invalidate_token`)
    /// while Apple sent no `consent-revoked` or `account-delete` about its subject: a revocation
    /// (or password change, forum thread 651237) Apple never told us about. Ids and hashes only.
    struct SweepFinding {
        var userID: UUID
        var clientID: String
        var foundAt: Date
        var appleError: String?
        var subjectHash: String
    }

    /// The newest `limit` findings. The sub is read only to compute its keyed hash (as the
    /// notification inbox stores it, `SubjectHasher`), which is all a page shows of it.
    func sweepFindings(subjectHash: (_ teamID: String, _ sub: String) -> String, limit: Int = 100) throws -> [SweepFinding] {
        let found = try pool.query(
            """
            SELECT t.user_id, t.client_id, t.revoked_at, t.last_validation_error, i.team_id, i.sub
            FROM apple_tokens t JOIN apple_identities i ON i.id = t.identity_id
            WHERE t.revoked_reason = 'token_invalid' ORDER BY t.revoked_at DESC LIMIT \(limit)
            """
        ).map { row in
            SweepFinding(
                userID: try row.decode(UUID.self, "user_id"), clientID: try row.decode(String.self, "client_id"),
                foundAt: try row.decode(Date.self, "revoked_at"),
                appleError: try row.decode(String?.self, "last_validation_error"),
                subjectHash: subjectHash(try row.decode(String.self, "team_id"), try row.decode(String.self, "sub")))
        }
        guard !found.isEmpty else { return [] }
        let notified = Set(
            try pool.query(
                """
                SELECT DISTINCT sub_hash FROM apple_notifications
                WHERE sub_hash = ANY (\(PostgresTextArray(found.map(\.subjectHash)))::text[])
                  AND event_type IN ('consent-revoked', 'account-delete', 'account-deleted')
                """
            ).map { try $0.decode(String.self, "sub_hash") })
        return found.filter { !notified.contains($0.subjectHash) }
    }

    struct AuditFilter {
        var actor: String?
        var action: String?
        var subject: String?
        var deletionID: UUID?
        var from: Date?
        var to: Date?
    }

    struct AuditEntry {
        var id: Int64
        var at: Date
        var actor: String
        var action: String
        var subject: String?
        var deletionID: UUID?
        var detail: String
        /// What was acted on, and what came of it (sql/0025; nil in rows of earlier releases).
        var target: String?
        var outcome: String?
    }

    /// Entries newest first; `limit` bounds an export as well as a page.
    func audit(_ filter: AuditFilter, limit: Int) throws -> [AuditEntry] {
        try pool.query(
            """
            SELECT id, at, actor, action, subject, deletion_id, detail::text AS detail, target, outcome FROM audit_log
            WHERE (\(filter.actor)::text IS NULL OR actor = \(filter.actor)::text)
              AND (\(filter.action)::text IS NULL OR action = \(filter.action)::text)
              AND (\(filter.subject)::text IS NULL OR subject = \(filter.subject)::text)
              AND (\(filter.deletionID)::uuid IS NULL OR deletion_id = \(filter.deletionID)::uuid)
              AND (\(filter.from)::timestamptz IS NULL OR at >= \(filter.from)::timestamptz)
              AND (\(filter.to)::timestamptz IS NULL OR at < \(filter.to)::timestamptz)
            ORDER BY id DESC LIMIT \(limit)
            """
        ).map { row in
            AuditEntry(
                id: try row.decode(Int64.self, "id"), at: try row.decode(Date.self, "at"),
                actor: try row.decode(String.self, "actor"), action: try row.decode(String.self, "action"),
                subject: try row.decode(String?.self, "subject"), deletionID: try row.decode(UUID?.self, "deletion_id"),
                detail: try row.decode(String.self, "detail"), target: try row.decode(String?.self, "target"),
                outcome: try row.decode(String?.self, "outcome"))
        }
    }
}
