import Foundation
import PostgresClient

/// The database side of Apple's notifications (`NotificationReceiver` keeps the decisions):
/// applying one exactly once (`broker_apply_notification`: the inbox row by `jti`, the change
/// and its outbox events in one transaction) and pruning the inbox.
struct NotificationStore: Sendable {
    let pool: PostgresPool

    /// Applies a verified notification to the group of its audience; the answer is the SQL
    /// function's. A concurrent delivery of the same `jti` surfaces as a unique violation.
    func apply(
        _ notification: AppleNotification, teamID: String, group: AppGroups.Group, subjectHash: String
    ) throws -> NotificationReceiver.Outcome {
        try pool.query(
            """
            SELECT broker_apply_notification(\(notification.jti), \(notification.type), \(teamID),
                \(notification.sub), \(notification.eventTime), \(group.primary), \(PostgresTextArray(group.clientIDs)),
                \(subjectHash))
            """
        ).single().decode(NotificationReceiver.Outcome.self, "broker_apply_notification")
    }

    /// Notifications received longer ago than the retention.
    static func prune(_ pool: PostgresPool, retentionSeconds: Int) throws {
        try pool.query("DELETE FROM apple_notifications WHERE received_at < now() - make_interval(secs => \(retentionSeconds))")
    }
}
