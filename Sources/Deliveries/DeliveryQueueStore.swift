import Foundation
import PostgresClient

/// A lane's table, named by the store of the module that owns it (`webhook_deliveries` by
/// BrokerCore's, `oidc_logout_deliveries` by the provider's): this module reaches a table
/// only through a lane that hands it over, and names none itself.
///
/// Every lane table has the queue's columns: `id bigserial`, `state` (`pending`, `delivered`,
/// `failed`), `attempts`, `next_attempt_at`, `last_status`, `last_error`, `created_at`,
/// `delivered_at`; the rest (what to send, to whom, in which order) is the lane's.
package struct DeliveryTable: Sendable, Hashable {
    package let name: String

    /// A constant written in code, never input: the name is spliced into SQL.
    package init(_ name: StaticString) {
        self.name = "\(name)"
        precondition(self.name.allSatisfy { $0.isLowercase || $0 == "_" }, "a lane table is a plain identifier")
    }
}

/// Where a delivery is (`state` of every lane table).
package enum DeliveryState: String, Sendable, CaseIterable, PostgresDecodable {
    case pending, delivered, failed
}

/// The queue half every lane shares: claiming the oldest due row under a lease, recording an
/// attempt's outcome, the backlog for metrics, re-driving a dead letter and pruning. A lane
/// with an order of its own (webhooks: per subscription and user) claims through its own
/// store and uses the rest from here.
package struct DeliveryQueueStore: Sendable {
    package let pool: PostgresPool
    package let table: DeliveryTable

    package init(pool: PostgresPool, table: DeliveryTable) {
        self.pool = pool
        self.table = table
    }

    /// The oldest due delivery, leased: `next_attempt_at` moves `lease` ahead and the attempt
    /// is counted, so a lane that dies mid-delivery loses nothing. `returning` names the
    /// lane's own columns (a constant) besides `id`, `attempts` and `created_at`.
    package func claimOldestDue(lease: Duration, returning columns: StaticString) throws -> PostgresRow? {
        try pool.query(
            """
            UPDATE \(unescaped: table.name) SET attempts = attempts + 1, next_attempt_at = now() + \(lease)::interval
            WHERE id = (SELECT id FROM \(unescaped: table.name) WHERE state = 'pending' AND next_attempt_at <= now()
                        ORDER BY next_attempt_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
            RETURNING id, attempts, created_at, \(unescaped: "\(columns)")
            """
        ).first
    }

    /// The receiver took it.
    package func recordDelivered(_ id: Int64, status: Int) throws {
        try pool.query(
            """
            UPDATE \(unescaped: table.name) SET state = 'delivered', delivered_at = now(), last_status = \(status), last_error = NULL
            WHERE id = \(id)
            """)
    }

    /// A failed attempt: `failed` for good when `dead`, else due again after `delay`. `status`
    /// is the receiver's HTTP status, nil when none came back; `error` a category.
    package func recordFailure(_ id: Int64, dead: Bool, delay: Duration, status: Int?, error: String) throws {
        try pool.query(
            """
            UPDATE \(unescaped: table.name) SET state = CASE WHEN \(dead) THEN 'failed' ELSE 'pending' END,
                next_attempt_at = now() + \(delay)::interval, last_status = \(status), last_error = \(error)
            WHERE id = \(id)
            """)
    }

    /// Waiting and dead-lettered deliveries, and the age of the oldest waiting one.
    package func backlog() throws -> QueueBacklog? {
        try pool.query(
            """
            SELECT count(*) FILTER (WHERE state = 'pending') AS backlog, count(*) FILTER (WHERE state = 'failed') AS dead_letters,
                   COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE state = 'pending')), 0) AS oldest_age
            FROM \(unescaped: table.name)
            """
        ).first.map(QueueBacklog.init)
    }

    /// Puts a dead letter back in the queue as new (attempts and age start again); false when
    /// `id` is not `failed`. A lane that scopes re-drives (an API key's own rows) checks that first.
    package func redrive(_ id: Int64) throws -> Bool {
        try pool.withConnection { try redrive(id, on: $0) }
    }

    /// `redrive(_:)` on `connection`, inside the caller's transaction (which audits it).
    package func redrive(_ id: Int64, on connection: PostgresConnection) throws -> Bool {
        try connection.query(
            """
            UPDATE \(unescaped: table.name) SET state = 'pending', attempts = 0, next_attempt_at = now(), created_at = now()
            WHERE id = \(id) AND state = 'failed'
            """
        ).affectedRows == 1
    }

    /// What waits (`pending`) or failed for good (`failed`), per UTC day it was queued, over
    /// the last `days` (1 to 92); anything queued before the first day counts on the first day.
    package func backlogByDay(days: Int) throws -> [QueuedDay] {
        let first = min(max(days, 1), 92) - 1
        return try pool.query(
            """
            WITH since AS (SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - make_interval(days => \(first)) AS start)
            SELECT greatest(date_trunc('day', d.created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', since.start) AS day,
                   d.state, count(*) AS n
            FROM \(unescaped: table.name) d, since WHERE d.state IN ('pending', 'failed') GROUP BY 1, 2
            """
        ).map { row in
            QueuedDay(
                day: try row.decode(Date.self, "day"), state: try row.decode(DeliveryState.self, "state"),
                count: try row.decode(Int.self, "n"))
        }
    }

    /// Delivered deliveries older than `retention`; dead letters, and deliveries parked at
    /// 'infinity' (a paused webhook subscription), older than `deadLetterRetention`. Due
    /// deliveries are never pruned. Returns how many went.
    @discardableResult
    package func prune(retention: Duration, deadLetterRetention: Duration) throws -> Int {
        try pool.query(
            """
            DELETE FROM \(unescaped: table.name)
            WHERE (state = 'delivered' AND delivered_at < now() - \(retention)::interval)
               OR ((state = 'failed' OR (state = 'pending' AND next_attempt_at = 'infinity'))
                   AND created_at < now() - \(deadLetterRetention)::interval)
            """
        ).affectedRows
    }
}

/// A lane's backlog on one day (`DeliveryQueueStore.backlogByDay`).
package struct QueuedDay: Sendable, Equatable {
    /// Midnight UTC of the day queued.
    package var day: Date
    package var state: DeliveryState
    package var count: Int
}
