import Foundation
import PostgresClient

/// The database side of Apple's notifications (`NotificationReceiver` keeps the decisions):
/// applying one exactly once (`broker_apply_notification_v2`: the inbox row by `jti`, the change
/// and its outbox events in one statement, with the app it was for; a consent-revoked older
/// than the group's last verified sign-in is `stale`) and pruning the inbox.
package struct NotificationStore: Sendable {
    let pool: PostgresPool

    package init(pool: PostgresPool) { self.pool = pool }

    /// Applies a verified notification to the group of its audience; the answer is the SQL
    /// function's. One statement in its own transaction: the function also records which app it
    /// was for (the `aud`) and, for an applied email event that carries the address, replaces
    /// the identity's (Apple news j5j9ep1b, 2025-10-09; protocol reference §11.8). A concurrent
    /// delivery of the same `jti` surfaces as a unique violation.
    func apply(
        _ notification: AppleNotification, teamID: String, group: AppGroups.Group, subjectHash: String
    ) throws -> NotificationReceiver.Outcome {
        // The address is only an email event's; the function applies it only when applied.
        let email = notification.type.hasPrefix("email-") ? notification.email : nil
        return try pool.query(
            """
            SELECT broker_apply_notification_v2(\(notification.jti), \(notification.type), \(teamID),
                \(notification.sub), \(notification.eventTime), \(group.primary), \(PostgresTextArray(group.clientIDs)),
                \(subjectHash), \(notification.audience), \(email), \(email.map { _ in notification.isPrivateEmail ?? false }))
            """
        ).single().decode(NotificationReceiver.Outcome.self, "broker_apply_notification_v2")
    }

    /// Notifications received longer ago than the retention.
    static func prune(_ pool: PostgresPool, retention: Duration) throws {
        try pool.query("DELETE FROM apple_notifications WHERE received_at < now() - \(retention)::interval")
    }

    /// Notifications received per UTC day and client id (`aud`; empty: rows the previous
    /// release wrote, which name none), over the last `days` (1 to 92). Client ids are those the
    /// broker accepts: bounded by its settings.
    package func countsByClient(days: Int) throws -> [DailyCount] {
        let days = min(max(days, 1), 92)
        return try pool.query(
            """
            SELECT date_trunc('day', received_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS day,
                   COALESCE(client_id, '') AS category, count(*) AS n
            FROM apple_notifications
            WHERE received_at >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - make_interval(days => \(days - 1))
            GROUP BY 1, 2
            """
        ).map { row in
            DailyCount(
                day: try row.decode(Date.self, "day"), category: try row.decode(String.self, "category"),
                count: try row.decode(Int.self, "n"))
        }
    }
}
