import Deliveries
import Foundation
import Observability
import PostgresClient
import StrictJSON

/// `webhook_deliveries`, BrokerCore's: the webhook lane's rows (`WebhookLane`). The queue
/// half (outcomes, backlog, re-drive, pruning) is the delivery engine's shared
/// `DeliveryQueueStore` over this table; the claim is the lane's own, since a row is
/// claimable only at the head of its (subscription, user) queue. Listing and re-driving
/// (the API's side) are below, on the subscriptions' store.
package struct WebhookDeliveryStore: Sendable {
    let pool: PostgresPool

    package init(pool: PostgresPool) { self.pool = pool }

    /// The lane's table: BrokerCore owns it, the engine works it.
    static let table = DeliveryTable("webhook_deliveries")

    package var queue: DeliveryQueueStore { DeliveryQueueStore(pool: pool, table: Self.table) }

    /// What a claimed webhook delivery carries.
    package struct Item: Sendable {
        var eventID: Int64
        var type: String
        var payload: String
        var eventCreatedAt: Date
        var subscriptionID: UUID
        var url: String
        var secret: [UInt8]
        var keyID: String
    }

    /// The next due delivery at the head of its (subscription, user) queue, leased for `lease`.
    func claim(lease: Duration) throws -> ClaimedDelivery<Item>? {
        // sql/0005_webhook_claim.sql: the claim's plan is pinned there (why is told there too).
        guard let row = try pool.query("SELECT * FROM broker_claim_webhook_delivery(\(lease)::interval)").first else {
            return nil
        }
        return ClaimedDelivery(
            id: try row.decode(Int64.self, "delivery_id"), attempts: try row.decode(Int.self, "attempts"),
            createdAt: try row.decode(Date.self, "delivery_created_at"),
            item: Item(
                eventID: try row.decode(Int64.self, "event_id"), type: try row.decode(String.self, "event_type"),
                payload: try row.decode(String.self, "payload"), eventCreatedAt: try row.decode(Date.self, "event_created_at"),
                subscriptionID: try row.decode(UUID.self, "subscription_id"), url: try row.decode(String.self, "url"),
                secret: try row.decode([UInt8].self, "secret"), keyID: try row.decode(String.self, "key_id")))
    }

    /// Deliveries past their retention (the engine's rule, see `DeliveryQueueStore.prune`),
    /// then events older than the retention with no delivery left (see `EventRetention`).
    static func prune(_ pool: PostgresPool, retention: Duration, deadLetterRetention: Duration) throws -> (
        deliveries: Int, events: Int
    ) {
        let deliveries = try DeliveryQueueStore(pool: pool, table: table).prune(
            retention: retention, deadLetterRetention: deadLetterRetention)
        let events = try pool.query(
            """
            DELETE FROM outbox_events e WHERE e.created_at < now() - \(retention)::interval
              AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id)
            """)
        return (deliveries, events.affectedRows)
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

    /// Waiting and dead-lettered deliveries, and the subscriptions, at a glance.
    package func figures() throws -> (pending: Int, failed: Int, subscriptions: Int) {
        let row = try pool.query(
            """
            SELECT (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending') AS pending,
                   (SELECT count(*) FROM webhook_deliveries WHERE state = 'failed') AS failed,
                   (SELECT count(*) FROM webhook_subscriptions) AS subscriptions
            """
        ).single()
        return (
            try row.decode(Int.self, "pending"), try row.decode(Int.self, "failed"), try row.decode(Int.self, "subscriptions")
        )
    }

    /// A `user.deleted` delivery to one subscription (Art. 19 GDPR evidence of a deletion).
    package struct UserDeletedDelivery: Sendable {
        package var subscriptionID: UUID
        package var state: String
        package var attempts: Int
        package var deliveredAt: Date?
    }

    /// The `user.deleted` deliveries of a user, per subscription.
    package func userDeletedDeliveries(userID: UUID) throws -> [UserDeletedDelivery] {
        try pool.query(
            """
            SELECT d.subscription_id, d.state, d.attempts, d.delivered_at
            FROM webhook_deliveries d JOIN outbox_events e ON e.id = d.event_id
            WHERE e.type = 'user.deleted' AND e.user_id = \(userID) ORDER BY d.id
            """
        ).map { row in
            UserDeletedDelivery(
                subscriptionID: try row.decode(UUID.self, "subscription_id"), state: try row.decode(String.self, "state"),
                attempts: try row.decode(Int.self, "attempts"), deliveredAt: try row.decode(Date?.self, "delivered_at"))
        }
    }

    /// Puts a failed delivery back in the queue as new, audited (`webhook_delivery.retried`,
    /// the outcome `failed` when there was no such failed delivery); false when it is not
    /// `failed` (or not the owner's).
    package func redrive(delivery id: Int64, ownedBy owner: String?, actor: String) throws -> Bool {
        try pool.withTransaction { connection in
            let owned =
                try owner.map { owner in
                    try !connection.query(
                        """
                        SELECT 1 FROM webhook_deliveries d JOIN webhook_subscriptions s ON s.id = d.subscription_id
                        WHERE d.id = \(id) AND s.api_key_id = \(owner)
                        """
                    ).isEmpty
                } ?? true
            let redriven = try owned && WebhookDeliveryStore(pool: pool).queue.redrive(id, on: connection)
            try AuditLog.record(
                connection, actor: actor, action: "webhook_delivery.retried", target: "webhook_delivery:\(id)",
                outcome: redriven ? .succeeded : .failed)
            return redriven
        }
    }
}
