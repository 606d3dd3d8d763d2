import Foundation
import HTTPServer
import Observability
import PostgresClient
import StrictJSON

/// Webhook subscriptions and deliveries (scope `admin`) and the pull feed (scope `events`).
enum EventRoutes {
    static func register(
        on router: inout Router, subscriptions: WebhookSubscriptionStore, feed: EventFeed, keys: APIKeyAuthenticator,
        wakeDispatcher: @escaping @Sendable () -> Void
    ) {
        router.post("/v1/webhook-subscriptions", keys.protect(.admin) { request, key in
            let body = try request.jsonObject()
            let url = try subscriptions.validate(url: try body.requiredString("url"))
            guard let topics = try body.strings("topics") else { throw Problem.badRequest("field `topics` is required") }
            let description = try body.string("description")
            if let description, description.utf8.count > 500 { throw Problem.badRequest("field `description` is too long") }
            let (subscription, secret) = try subscriptions.create(
                url: url, topics: try WebhookSubscriptionStore.validate(topics: topics), description: description,
                actor: "api:\(key.id)", owner: key)
            guard case .object(var object) = subscription.json else { throw Problem.internalError }
            object["secret"] = .string(secret)
            return .json(.object(object), status: 201)
        })
        // A key limited to some apps sees and changes only the subscriptions it made.
        router.get("/v1/webhook-subscriptions", keys.protect(.admin) { _, key in
            .json(.object(["subscriptions": .array(try subscriptions.list(ownedBy: WebhookSubscriptionStore.owner(key)).map(\.json))]))
        })
        router.get("/v1/webhook-subscriptions/{id}", keys.protect(.admin) { request, key in
            guard let subscription = try subscriptions.find(try subscriptionID(request), ownedBy: WebhookSubscriptionStore.owner(key))
            else { throw notFound }
            return .json(subscription.json)
        })
        for (action, status) in [("pause", "paused"), ("resume", "active")] {
            router.post("/v1/webhook-subscriptions/{id}/\(action)", keys.protect(.admin) { request, key in
                let id = try subscriptionID(request)
                let owner = WebhookSubscriptionStore.owner(key)
                guard try subscriptions.setStatus(id, status, actor: "api:\(key.id)", ownedBy: owner),
                    let subscription = try subscriptions.find(id, ownedBy: owner)
                else { throw notFound }
                if status == "active" { wakeDispatcher() }
                return .json(subscription.json)
            })
        }
        router.delete("/v1/webhook-subscriptions/{id}", keys.protect(.admin) { request, key in
            guard try subscriptions.delete(try subscriptionID(request), actor: "api:\(key.id)", ownedBy: WebhookSubscriptionStore.owner(key))
            else { throw notFound }
            return .noContent
        })
        router.get("/v1/webhook-deliveries", keys.protect(.admin) { request, key in
            let owner = WebhookSubscriptionStore.owner(key)
            let state = request.query["state"]
            if let state, !["pending", "delivered", "failed"].contains(state) {
                throw Problem.badRequest("state must be pending, delivered or failed")
            }
            let rows = try subscriptions.pool.query(
                """
                SELECT d.id, d.event_id, e.type, d.subscription_id, d.state, d.attempts, d.last_status, d.last_error,
                       d.created_at, d.delivered_at
                FROM webhook_deliveries d JOIN outbox_events e ON e.id = d.event_id
                WHERE (\(state)::text IS NULL OR d.state = \(state)::text)
                  AND (\(owner)::text IS NULL
                       OR d.subscription_id IN (SELECT id FROM webhook_subscriptions WHERE api_key_id = \(owner)::text))
                ORDER BY d.id DESC LIMIT 500
                """)
            return .json(.object(["deliveries": .array(try rows.map { row in
                .object([
                    "id": .integer(try row.decode(Int64.self, 0)), "event_id": .string("evt_\(try row.decode(Int64.self, 1))"),
                    "type": .string(try row.decode(String.self, 2)),
                    "subscription_id": .string(try row.decode(UUID.self, 3).lowercasedString),
                    "state": .string(try row.decode(String.self, 4)), "attempts": .integer(Int64(try row.decode(Int.self, 5))),
                    "last_status": try row.decode(Int?.self, 6).map { .integer(Int64($0)) } ?? .null,
                    "last_error": try row.decode(String?.self, 7).map(JSONValue.string) ?? .null,
                    "created_at": .string(RFC3339.string(from: try row.decode(Date.self, 8))),
                    "delivered_at": try row.decode(Date?.self, 9).map { .string(RFC3339.string(from: $0)) } ?? .null,
                ])
            })]))
        })
        router.post("/v1/webhook-deliveries/{id}/retry", keys.protect(.admin) { request, key in
            guard let id = Int64(try request.parameter("id")) else { throw Problem.badRequest("the delivery id is a number") }
            let owner = WebhookSubscriptionStore.owner(key)
            let updated = try subscriptions.pool.query(
                """
                UPDATE webhook_deliveries SET state = 'pending', attempts = 0, next_attempt_at = now(), created_at = now()
                WHERE id = \(id) AND state = 'failed'
                  AND (\(owner)::text IS NULL
                       OR subscription_id IN (SELECT id FROM webhook_subscriptions WHERE api_key_id = \(owner)::text))
                """)
            guard updated.affectedRows == 1 else {
                throw Problem(
                    status: 409, code: "delivery_not_failed", title: "Not a failed delivery",
                    detail: "only failed deliveries can be re-driven")
            }
            wakeDispatcher()
            return .json(.object(["id": .integer(id), "state": "pending"]), status: 202)
        })
        router.get("/v1/events", keys.protect(.events) { request, key in
            let cursor: EventFeed.Cursor
            if let text = request.query["after"], !text.isEmpty {
                guard let parsed = EventFeed.Cursor(text: text) else {
                    throw Problem.badRequest(code: "invalid_cursor", "the cursor is not one this feed handed out")
                }
                cursor = parsed
            } else {
                cursor = .start
            }
            let limit = try request.query["limit"].map { text -> Int in
                guard let limit = Int(text), (1...1000).contains(limit) else { throw Problem.badRequest("limit must be 1…1000") }
                return limit
            } ?? 100
            let page = try feed.page(after: cursor, limit: limit, reach: key.reachArray)
            return .json(.object(["events": .array(page.events), "next_cursor": .string(page.next.text)]))
        })
    }

    static let notFound = Problem(
        status: 404, code: "subscription_not_found", title: "Subscription not found", detail: "no subscription with this id")

    static func subscriptionID(_ request: HTTPRequest) throws -> UUID {
        guard let id = UUID(canonicalText: try request.parameter("id")) else {
            throw Problem.badRequest(code: "invalid_subscription_id", "the subscription id must be a UUID")
        }
        return id
    }
}
