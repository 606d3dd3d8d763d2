import Foundation
import Observability
import PostgresClient
import StrictJSON

/// Where a webhook delivery is (`webhook_deliveries.state`).
enum DeliveryState: String, Sendable, CaseIterable, PostgresDecodable {
    case pending, delivered, failed
}

/// One delivery as `GET /v1/webhook-deliveries` lists it.
struct WebhookDelivery: Sendable {
    var id: Int64
    var eventID: Int64
    var type: String
    var subscriptionID: UUID
    var state: DeliveryState
    var attempts: Int
    var lastStatus: Int?
    /// A category (`timeout`, `address_not_allowed`, …), never a receiver's text.
    var lastError: String?
    var createdAt: Date
    var deliveredAt: Date?

    var json: JSONValue {
        .object([
            "id": .integer(id), "event_id": .string("evt_\(eventID)"), "type": .string(type),
            "subscription_id": .string(subscriptionID.lowercasedString), "state": .string(state.rawValue),
            "attempts": .integer(Int64(attempts)), "last_status": lastStatus.map { .integer(Int64($0)) } ?? .null,
            "last_error": lastError.map(JSONValue.string) ?? .null, "created_at": .string(RFC3339.string(from: createdAt)),
            "delivered_at": deliveredAt.map { .string(RFC3339.string(from: $0)) } ?? .null,
        ])
    }
}

extension WebhookSubscriptionStore {
    /// The newest 500 deliveries, optionally in one state; `owner` (a limited key's id)
    /// sees only its subscriptions' deliveries.
    func deliveries(state: DeliveryState?, ownedBy owner: String?) throws -> [WebhookDelivery] {
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
            WebhookDelivery(
                id: try row.decode(Int64.self, "id"), eventID: try row.decode(Int64.self, "event_id"),
                type: try row.decode(String.self, "type"), subscriptionID: try row.decode(UUID.self, "subscription_id"),
                state: try row.decode(DeliveryState.self, "state"), attempts: try row.decode(Int.self, "attempts"),
                lastStatus: try row.decode(Int?.self, "last_status"), lastError: try row.decode(String?.self, "last_error"),
                createdAt: try row.decode(Date.self, "created_at"), deliveredAt: try row.decode(Date?.self, "delivered_at"))
        }
    }

    /// Puts a failed delivery back in the queue as new; false when it is not `failed` (or not the owner's).
    func redrive(delivery id: Int64, ownedBy owner: String?) throws -> Bool {
        try pool.query(
            """
            UPDATE webhook_deliveries
            SET state = \(DeliveryState.pending.rawValue), attempts = 0, next_attempt_at = now(), created_at = now()
            WHERE id = \(id) AND state = \(DeliveryState.failed.rawValue)
              AND (\(owner)::text IS NULL
                   OR subscription_id IN (SELECT id FROM webhook_subscriptions WHERE api_key_id = \(owner)::text))
            """
        ).affectedRows == 1
    }
}
