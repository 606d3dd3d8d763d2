import Foundation
import PostgresClient

/// The notification inbox as operators read it (the console's overview and operations pages):
/// figures, the last notification per app, counts by type and outcome, the newest entries.
/// Subjects appear only as their keyed hash, as the inbox stores them.
extension NotificationStore {
    /// When the last notification arrived, and how many in the last day.
    package func figures() throws -> (last: Date?, lastDay: Int) {
        let row = try pool.query(
            """
            SELECT max(received_at) AS last, count(*) FILTER (WHERE received_at > now() - interval '1 day') AS last_day
            FROM apple_notifications
            """
        ).single()
        return (try row.decode(Date?.self, "last"), try row.decode(Int.self, "last_day"))
    }

    /// The last notification per client id (`apple_notifications.client_id`, sql/0019) among
    /// `clientIDs`, and since when notifications carry their app at all (rows the previous
    /// release wrote have none, so an app's silence is only counted from then).
    package func lastNotifications(of clientIDs: [String]) throws -> (last: [String: Date], attributedSince: Date?) {
        var last: [String: Date] = [:]
        for row in try pool.query(
            """
            SELECT client_id, max(received_at) AS last FROM apple_notifications
            WHERE client_id = ANY (\(PostgresTextArray(clientIDs))::text[]) GROUP BY client_id
            """)
        {
            last[try row.decode(String.self, "client_id")] = try row.decode(Date.self, "last")
        }
        let since = try pool.query("SELECT min(received_at) AS since FROM apple_notifications WHERE client_id IS NOT NULL")
            .single().decode(Date?.self, "since")
        return (last, since)
    }

    package struct Count: Sendable {
        package var eventType: String
        package var outcome: String
        package var count: Int
        package var last: Date
    }

    /// Notifications kept in the inbox, by type and outcome.
    package func counts() throws -> [Count] {
        try pool.query(
            """
            SELECT event_type, outcome, count(*) AS n, max(received_at) AS last FROM apple_notifications
            GROUP BY event_type, outcome ORDER BY event_type, outcome
            """
        ).map { row in
            Count(
                eventType: try row.decode(String.self, "event_type"), outcome: try row.decode(String.self, "outcome"),
                count: try row.decode(Int.self, "n"), last: try row.decode(Date.self, "last"))
        }
    }

    package struct Recent: Sendable {
        package var eventType: String
        package var outcome: String
        package var subjectHash: String?
        package var receivedAt: Date
    }

    /// The newest `limit` notifications.
    package func recent(limit: Int = 50) throws -> [Recent] {
        try pool.query(
            "SELECT event_type, outcome, sub_hash, received_at FROM apple_notifications ORDER BY received_at DESC LIMIT \(limit)"
        ).map { row in
            Recent(
                eventType: try row.decode(String.self, "event_type"), outcome: try row.decode(String.self, "outcome"),
                subjectHash: try row.decode(String?.self, "sub_hash"), receivedAt: try row.decode(Date.self, "received_at"))
        }
    }

    /// Of these keyed sub hashes, those Apple sent a `consent-revoked` or `account-delete` about.
    package func revocationsNotified(amongHashes hashes: [String]) throws -> Set<String> {
        guard !hashes.isEmpty else { return [] }
        return Set(
            try pool.query(
                """
                SELECT DISTINCT sub_hash FROM apple_notifications
                WHERE sub_hash = ANY (\(PostgresTextArray(hashes))::text[])
                  AND event_type IN ('consent-revoked', 'account-delete', 'account-deleted')
                """
            ).map { try $0.decode(String.self, "sub_hash") })
    }
}
