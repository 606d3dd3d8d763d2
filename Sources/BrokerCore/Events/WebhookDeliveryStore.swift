import Foundation
import Observability
import PostgresClient
import StrictJSON

/// Where a webhook delivery is (`webhook_deliveries.state`).
package enum DeliveryState: String, Sendable, CaseIterable, PostgresDecodable {
    case pending, delivered, failed
}

/// The dispatcher's side of `webhook_deliveries` (`WebhookDispatcher` keeps the decisions):
/// claiming the next due delivery, recording an attempt's outcome, the backlog for metrics,
/// and retention. Listing and redriving (the API's side) are below, on the subscriptions' store.
package struct WebhookDeliveryStore: Sendable {
    let pool: PostgresPool

    struct Claimed: Sendable {
        var id: Int64
        var attempts: Int
        var createdAt: Date
        var eventID: Int64
        var type: String
        var payload: String
        var eventCreatedAt: Date
        var subscriptionID: UUID
        var url: String
        var secret: [UInt8]
        var keyID: String
    }

    /// The next due delivery at the head of its (subscription, user) queue, leased for `leaseSeconds`.
    func claim(leaseSeconds: Int) throws -> Claimed? {
        // sql/0005_webhook_claim.sql: the claim's plan is pinned there (why is told there too).
        guard
            let row = try pool.query(
                "SELECT * FROM broker_claim_webhook_delivery(\(String(leaseSeconds) + " seconds")::interval)"
            ).first
        else { return nil }
        return Claimed(
            id: try row.decode(Int64.self, "delivery_id"), attempts: try row.decode(Int.self, "attempts"),
            createdAt: try row.decode(Date.self, "delivery_created_at"), eventID: try row.decode(Int64.self, "event_id"),
            type: try row.decode(String.self, "event_type"), payload: try row.decode(String.self, "payload"),
            eventCreatedAt: try row.decode(Date.self, "event_created_at"),
            subscriptionID: try row.decode(UUID.self, "subscription_id"),
            url: try row.decode(String.self, "url"), secret: try row.decode([UInt8].self, "secret"),
            keyID: try row.decode(String.self, "key_id"))
    }

    /// A failed attempt: `failed` for good when `expired`, else `pending` again after `delayMilliseconds`.
    /// `status` is the receiver's HTTP status, nil when none came back; `error` a category.
    func recordFailure(_ id: Int64, expired: Bool, delayMilliseconds: Int, status: Int?, error: String) throws {
        try pool.query(
            """
            UPDATE webhook_deliveries SET
                state = CASE WHEN \(expired) THEN 'failed' ELSE 'pending' END,
                next_attempt_at = now() + \(String(delayMilliseconds) + " milliseconds")::interval,
                last_status = \(status), last_error = \(error)
            WHERE id = \(id)
            """)
    }

    /// The receiver answered 2xx.
    func recordDelivered(_ id: Int64, status: Int) throws {
        try pool.query(
            """
            UPDATE webhook_deliveries SET state = 'delivered', delivered_at = now(), last_status = \(status), last_error = NULL
            WHERE id = \(id)
            """)
    }

    /// Waiting and dead-lettered deliveries, and the age of the oldest waiting one, for `/metrics`.
    func backlog() throws -> QueueBacklog? {
        guard
            let row = try pool.query(
                """
                SELECT count(*) FILTER (WHERE state = 'pending') AS backlog, count(*) FILTER (WHERE state = 'failed') AS dead_letters,
                       COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE state = 'pending')), 0) AS oldest_age
                FROM webhook_deliveries
                """
            ).first
        else { return nil }
        return QueueBacklog(row)
    }

    /// Delivered deliveries older than the retention; failed ones, and ones parked by a
    /// paused subscription (pending at 'infinity'), older than the dead-letter retention;
    /// then events older than the retention with no delivery left (see `EventRetention`).
    static func prune(_ pool: PostgresPool, retentionSeconds: Int, deadLetterRetentionSeconds: Int) throws -> (
        deliveries: Int, events: Int
    ) {
        let retention = String(retentionSeconds) + " seconds"
        let deadLetterRetention = String(deadLetterRetentionSeconds) + " seconds"
        let deliveries = try pool.query(
            """
            DELETE FROM webhook_deliveries
            WHERE (state = 'delivered' AND delivered_at < now() - \(retention)::interval)
               OR ((state = 'failed' OR (state = 'pending' AND next_attempt_at = 'infinity'))
                   AND created_at < now() - \(deadLetterRetention)::interval)
            """)
        let events = try pool.query(
            """
            DELETE FROM outbox_events e WHERE e.created_at < now() - \(retention)::interval
              AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id)
            """)
        return (deliveries.affectedRows, events.affectedRows)
    }
}

extension WebhookSubscriptionStore {
    /// The newest 500 deliveries, optionally in one state, as `GET /v1/webhook-deliveries`
    /// lists them; `owner` (a limited key's id) sees only its subscriptions' deliveries.
    /// `last_error` is a category (`timeout`, `address_not_allowed`, …), never a receiver's text.
    package func deliveries(state: DeliveryState?, ownedBy owner: String?) throws -> [JSONValue] {
        try pool.query(
            """
            SELECT d.id, d.event_id, e.type, d.subscription_id, d.state, d.attempts, d.last_status, d.last_error,
                   d.created_at, d.delivered_at
            FROM webhook_deliveries d JOIN outbox_events e ON e.id = d.event_id
            WHERE (\(state?.rawValue)::text IS NULL OR d.state = \(state?.rawValue)::text)
              AND (\(owner)::text IS NULL
                   OR d.subscription_id IN (SELECT id FROM webhook_subscriptions WHERE api_key_id = \(owner)::text))
            ORDER BY d.id DESC LIMIT 500
            """
        ).map { row in
            .object([
                "id": .integer(try row.decode(Int64.self, "id")),
                "event_id": .string("evt_\(try row.decode(Int64.self, "event_id"))"),
                "type": .string(try row.decode(String.self, "type")),
                "subscription_id": .string(try row.decode(UUID.self, "subscription_id").lowercasedString),
                "state": .string(try row.decode(DeliveryState.self, "state").rawValue),
                "attempts": .integer(try row.decode(Int64.self, "attempts")),
                "last_status": try row.decode(Int64?.self, "last_status").map(JSONValue.integer) ?? .null,
                "last_error": try row.decode(String?.self, "last_error").map(JSONValue.string) ?? .null,
                "created_at": .string(RFC3339.string(from: try row.decode(Date.self, "created_at"))),
                "delivered_at": try row.decode(Date?.self, "delivered_at").map { .string(RFC3339.string(from: $0)) } ?? .null,
            ])
        }
    }

    /// Puts a failed delivery back in the queue as new, audited (`webhook_delivery.retried`,
    /// the outcome `failed` when there was no such failed delivery); false when it is not
    /// `failed` (or not the owner's).
    package func redrive(delivery id: Int64, ownedBy owner: String?, actor: String) throws -> Bool {
        try pool.withTransaction { connection in
            let redriven =
                try connection.query(
                    """
                    UPDATE webhook_deliveries
                    SET state = \(DeliveryState.pending.rawValue), attempts = 0, next_attempt_at = now(), created_at = now()
                    WHERE id = \(id) AND state = \(DeliveryState.failed.rawValue)
                      AND (\(owner)::text IS NULL
                           OR subscription_id IN (SELECT id FROM webhook_subscriptions WHERE api_key_id = \(owner)::text))
                    """
                ).affectedRows == 1
            try AuditLog.record(
                connection, actor: actor, action: "webhook_delivery.retried", target: "webhook_delivery:\(id)",
                outcome: redriven ? .succeeded : .failed)
            return redriven
        }
    }
}
