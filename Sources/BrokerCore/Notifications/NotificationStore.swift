import Foundation
import PostgresClient

/// The database side of Apple's notifications (`NotificationReceiver` keeps the decisions):
/// applying one exactly once (`broker_apply_notification_v2`: the inbox row by `jti`, the change
/// and its outbox events in one transaction, with the app it was for; a consent-revoked older
/// than the group's last verified sign-in is `stale`) and pruning the inbox.
package struct NotificationStore: Sendable {
    let pool: PostgresPool

    package init(pool: PostgresPool) { self.pool = pool }

    /// Applies a verified notification to the group of its audience; the answer is the SQL
    /// function's. A concurrent delivery of the same `jti` surfaces as a unique violation.
    /// An applied email event's address is applied too (`applyEmail`), in the same transaction.
    func apply(
        _ notification: AppleNotification, teamID: String, group: AppGroups.Group, subjectHash: String
    ) throws -> NotificationReceiver.Outcome {
        try pool.withTransaction { connection in
            let outcome = try connection.query(
                """
                SELECT broker_apply_notification_v2(\(notification.jti), \(notification.type), \(teamID),
                    \(notification.sub), \(notification.eventTime), \(group.primary), \(PostgresTextArray(group.clientIDs)),
                    \(subjectHash))
                """
            ).single().decode(NotificationReceiver.Outcome.self, "broker_apply_notification_v2")
            // Which app it was for (sql/0019; the console's silence per app). Beside the released
            // function, not in it: the previous release keeps calling it and leaves this NULL.
            if outcome != .duplicate {
                try connection.query(
                    "UPDATE apple_notifications SET client_id = \(notification.audience) WHERE jti = \(notification.jti)")
            }
            if outcome == .applied { try Self.applyEmail(notification, teamID: teamID, connection) }
            return outcome
        }
    }

    /// What the user sees follows Apple's email events (Apple news j5j9ep1b, 2025-10-09;
    /// protocol reference §11.8): their `email` and `is_private_email` replace the identity's,
    /// unless a sign-in verified a newer state (a second's grace: event times may come in whole
    /// seconds), with `identity.updated` (source `apple`).
    private static func applyEmail(_ notification: AppleNotification, teamID: String, _ connection: some PostgresQuerying) throws
    {
        guard notification.type.hasPrefix("email-"), let email = notification.email else { return }
        let isPrivate = notification.isPrivateEmail ?? false
        guard
            let row = try connection.query(
                """
                UPDATE apple_identities SET email = \(email), is_private_email = \(isPrivate)
                WHERE team_id = \(teamID) AND sub = \(notification.sub)
                  AND (last_verified_at IS NULL OR last_verified_at < \(notification.eventTime)::timestamptz + interval '1 second')
                  AND (email IS DISTINCT FROM \(email) OR is_private_email IS DISTINCT FROM \(isPrivate))
                RETURNING user_id, email_verified
                """
            ).first
        else { return }
        let userID = try row.decode(UUID.self, "user_id")
        try connection.query(
            """
            SELECT broker_emit_event('identity.updated', \(userID), jsonb_build_object(
                'user_id', \(userID)::uuid, 'changed', jsonb_build_array('email'),
                'email_verified', \(try row.decode(Bool.self, "email_verified"))::boolean,
                'is_private_email', \(isPrivate)::boolean, 'source', 'apple'))
            """)
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
