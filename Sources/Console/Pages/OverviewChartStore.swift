import BrokerCore
import Foundation
import PostgresClient

/// The overview charts' figures the console reads itself: notifications and the two delivery
/// backlogs, per UTC day of the last `days` (at most 92), in a handful of categories each.
extension ConsoleStore {
    /// Notifications received per day and client id (`aud`; empty: rows the previous release
    /// wrote, which name none). Client ids are those the broker accepts: bounded by its settings.
    func notificationsByClient(days: Int) throws -> [DailyCount] {
        let days = min(max(days, 1), 92)
        return try pool.query(
            """
            SELECT date_trunc('day', received_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS day,
                   COALESCE(client_id, '') AS category, count(*) AS n
            FROM apple_notifications
            WHERE received_at >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - make_interval(days => \(days - 1))
            GROUP BY 1, 2
            """
        ).map(Self.dailyCount)
    }

    /// What waits (`pending`) or failed for good (`failed`) in a delivery queue, by the day it
    /// was queued; anything queued before the first day counts on the first day.
    func backlogByDay(_ queue: BacklogQueue, days: Int) throws -> [DailyCount] {
        let first = min(max(days, 1), 92) - 1
        let rows: PostgresRows
        switch queue {
        case .webhooks:
            rows = try pool.query(
                """
                WITH since AS (SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - make_interval(days => \(first)) AS start)
                SELECT greatest(date_trunc('day', d.created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', since.start) AS day,
                       d.state AS category, count(*) AS n
                FROM webhook_deliveries d, since WHERE d.state IN ('pending', 'failed') GROUP BY 1, 2
                """)
        case .logouts:
            rows = try pool.query(
                """
                WITH since AS (SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - make_interval(days => \(first)) AS start)
                SELECT greatest(date_trunc('day', d.created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', since.start) AS day,
                       d.state AS category, count(*) AS n
                FROM oidc_logout_deliveries d, since WHERE d.state IN ('pending', 'failed') GROUP BY 1, 2
                """)
        }
        return try rows.map(Self.dailyCount)
    }

    /// The delivery queues the overview charts.
    enum BacklogQueue { case webhooks, logouts }

    static func dailyCount(_ row: PostgresRow) throws -> DailyCount {
        DailyCount(
            day: try row.decode(Date.self, "day"), category: try row.decode(String.self, "category"),
            count: try row.decode(Int.self, "n"))
    }
}
