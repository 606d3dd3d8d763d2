import PostgresClient

/// A work queue's size for `/metrics` (a delivery lane, deletion requests): what waits, what
/// failed for good, and the age of the oldest waiting item, from one row with the columns
/// `backlog`, `dead_letters` and `oldest_age` (a figure that cannot be read counts as 0).
package struct QueueBacklog: Sendable {
    package var pending: Double
    package var deadLetters: Double
    package var oldestPendingAgeSeconds: Double

    package init(_ row: PostgresRow) {
        pending = (try? row.decode(Double.self, "backlog")) ?? 0
        deadLetters = (try? row.decode(Double.self, "dead_letters")) ?? 0
        oldestPendingAgeSeconds = (try? row.decode(Double.self, "oldest_age")) ?? 0
    }
}
