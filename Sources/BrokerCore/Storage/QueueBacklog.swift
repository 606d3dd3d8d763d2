import PostgresClient

/// A work queue's size for `/metrics` (webhook deliveries, deletion requests): what waits, what
/// failed for good, and the age of the oldest waiting item, from one row with the columns
/// `backlog`, `dead_letters` and `oldest_age` (a figure that cannot be read counts as 0).
struct QueueBacklog: Sendable {
    var pending: Double
    var deadLetters: Double
    var oldestPendingAgeSeconds: Double

    init(_ row: PostgresRow) {
        pending = (try? row.decode(Double.self, "backlog")) ?? 0
        deadLetters = (try? row.decode(Double.self, "dead_letters")) ?? 0
        oldestPendingAgeSeconds = (try? row.decode(Double.self, "oldest_age")) ?? 0
    }
}
