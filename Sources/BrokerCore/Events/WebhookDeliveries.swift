import Foundation
import Observability
import PostgresClient
import StrictJSON

/// Where a webhook delivery is (`webhook_deliveries.state`).
package enum DeliveryState: String, Sendable, CaseIterable, PostgresDecodable {
    case pending, delivered, failed
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
                "id": .integer(try row.decode(Int64.self, "id")), "event_id": .string("evt_\(try row.decode(Int64.self, "event_id"))"),
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

    /// Puts a failed delivery back in the queue as new; false when it is not `failed` (or not the owner's).
    package func redrive(delivery id: Int64, ownedBy owner: String?) throws -> Bool {
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
