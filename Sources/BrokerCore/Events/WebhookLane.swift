import BrokerCrypto
import Deliveries
import Foundation
import HTTPClient
import Observability
import PostgresClient
import StrictJSON

/// Webhooks as a delivery lane (`DeliveryEngine` does the claiming, sending, backoff and
/// dead-lettering): outbox events to webhook subscribers, Standard Webhooks style: a JSON
/// body `{id, type, timestamp, data}` (`id` as in the pull feed) and headers `webhook-id`
/// (stable per event and subscription, so receivers can deduplicate), `webhook-timestamp`
/// and `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`.
///
/// A delivery row per (event, subscription) is written in the transaction that wrote the
/// event. A row is claimable only at the head of its (subscription, user) queue, so one
/// user's events reach each subscriber in order while different users go in parallel. 2xx
/// is delivered; anything else (redirects are not followed), a timeout or a broken
/// connection is retried until the delivery is older than the maximum age, then it is `failed`.
/// Events written by this process wake the lane at once; other processes' wait for its poll
/// (`broker_emit_event` sends no NOTIFY, which would serialise every login's commit).
package struct WebhookLane: DeliveryLane {
    let deliveries: WebhookDeliveryStore
    let subscriptions: WebhookSubscriptionStore

    package init(pool: PostgresPool, subscriptions: WebhookSubscriptionStore) {
        deliveries = WebhookDeliveryStore(pool: pool)
        self.subscriptions = subscriptions
    }

    package var names: DeliveryLaneNames { DeliveryLaneNames(metricPrefix: "webhook", title: "Webhook") }
    package var queue: DeliveryQueueStore { deliveries.queue }

    package typealias Item = WebhookDeliveryStore.Item

    package func claim(lease: Duration) throws -> ClaimedDelivery<Item>? { try deliveries.claim(lease: lease) }

    package func request(for delivery: ClaimedDelivery<Item>) throws -> HTTPClientRequest {
        let secret: [UInt8]
        do {
            secret = try subscriptions.secret(
                sealed: delivery.item.secret, keyID: delivery.item.keyID, subscriptionID: delivery.item.subscriptionID)
        } catch {
            throw DeliveryFailure.secretUnreadable
        }
        return Self.request(delivery.item, secret: secret, timestamp: Int(Date().timeIntervalSince1970))
    }

    package func receiverFields(_ delivery: ClaimedDelivery<Item>) -> [(String, String)] {
        [("subscription", delivery.item.subscriptionID.lowercasedString)]
    }

    /// The Standard Webhooks message id: stable for this event and subscription.
    static func messageID(eventID: Int64, subscriptionID: UUID) -> String {
        "msg_\(eventID)_" + subscriptionID.lowercasedString.replacingOccurrences(of: "-", with: "")
    }

    /// The signed request for one delivery.
    static func request(_ delivery: Item, secret: [UInt8], timestamp: Int) -> HTTPClientRequest {
        let data = (try? JSONValue.parse(Array(delivery.payload.utf8))) ?? .null
        // `id` is the event's id in the pull feed (`evt_…`): a delivery and the feed can be matched.
        let body = JSONValue.object([
            "id": .string("evt_\(delivery.eventID)"), "type": .string(delivery.type),
            "timestamp": .string(RFC3339.string(from: delivery.eventCreatedAt)), "data": data,
        ]).serialized()
        let id = messageID(eventID: delivery.eventID, subscriptionID: delivery.subscriptionID)
        let signed = Array("\(id).\(timestamp).".utf8) + body
        let signature = "v1," + Data(HMACSHA256.authenticate(signed, key: secret)).base64EncodedString()
        return HTTPClientRequest(
            method: "POST", url: delivery.url,
            headers: [
                ("Content-Type", "application/json"), ("webhook-id", id), ("webhook-timestamp", String(timestamp)),
                ("webhook-signature", signature), ("User-Agent", "appleid-broker-webhooks"),
            ],
            body: body)
    }
}
