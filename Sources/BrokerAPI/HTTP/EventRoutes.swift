import BrokerCore
import Deliveries
import Foundation
import HTTPServer
import StrictJSON

/// Webhook subscriptions and deliveries (scope `admin`) and the pull feed (scope `events`).
enum EventRoutes {
    static func register(
        on router: inout Router, subscriptions: WebhookSubscriptionStore, feed: EventFeed, keys: APIKeyAuthenticator,
        wakeDispatcher: @escaping @Sendable () -> Void
    ) {
        router.group(keys.requiring(.admin)) { router in
            adminRoutes(on: &router, subscriptions: subscriptions, wakeDispatcher: wakeDispatcher)
        }
        router.group(keys.requiring(.events)) { router in feedRoutes(on: &router, feed: feed) }
    }

    private static func adminRoutes(
        on router: inout Router, subscriptions: WebhookSubscriptionStore, wakeDispatcher: @escaping @Sendable () -> Void
    ) {
        router.post(
            "/v1/webhook-subscriptions",
            authenticated { request, key in
                let body = try request.jsonObject()
                let url = try subscriptions.validate(url: try body.requiredString("url"))
                guard let topics = try body.strings("topics") else {
                    throw BrokerError.invalidRequest("field `topics` is required")
                }
                let description = try body.string("description")
                if let description, description.utf8.count > 500 {
                    throw BrokerError.invalidRequest("field `description` is too long")
                }
                let (subscription, secret) = try subscriptions.create(
                    url: url, topics: try WebhookSubscriptionStore.validate(topics: topics), description: description,
                    actor: "api:\(key.id)", owner: key)
                guard case .object(var object) = subscription.json else { preconditionFailure("a subscription is a JSON object") }
                object["secret"] = .string(secret)
                return .json(.object(object), status: 201)
            })
        // A key limited to some apps sees and changes only the subscriptions it made.
        router.get(
            "/v1/webhook-subscriptions",
            authenticated { _, key in
                .json(
                    .object([
                        "subscriptions": .array(try subscriptions.list(ownedBy: WebhookSubscriptionStore.owner(key)).map(\.json))
                    ]))
            })
        router.get(
            "/v1/webhook-subscriptions/{id}",
            authenticated { request, key in
                guard
                    let subscription = try subscriptions.find(
                        try subscriptionID(request), ownedBy: WebhookSubscriptionStore.owner(key))
                else { throw notFound }
                return .json(subscription.json)
            })
        for (action, status) in [("pause", SubscriptionStatus.paused), ("resume", .active)] {
            router.post(
                "/v1/webhook-subscriptions/{id}/\(action)",
                authenticated { request, key in
                    let id = try subscriptionID(request)
                    let owner = WebhookSubscriptionStore.owner(key)
                    guard try subscriptions.setStatus(id, status, actor: "api:\(key.id)", ownedBy: owner),
                        let subscription = try subscriptions.find(id, ownedBy: owner)
                    else { throw notFound }
                    if status == .active { wakeDispatcher() }
                    return .json(subscription.json)
                })
        }
        router.delete(
            "/v1/webhook-subscriptions/{id}",
            authenticated { request, key in
                guard
                    try subscriptions.delete(
                        try subscriptionID(request), actor: "api:\(key.id)", ownedBy: WebhookSubscriptionStore.owner(key))
                else { throw notFound }
                return .noContent
            })
        router.get(
            "/v1/webhook-deliveries",
            authenticated { request, key in
                let deliveries = try subscriptions.deliveries(
                    state: try request.stateParameter(DeliveryState.self), ownedBy: WebhookSubscriptionStore.owner(key))
                return .json(.object(["deliveries": .array(deliveries)]))
            })
        router.post(
            "/v1/webhook-deliveries/{id}/retry",
            authenticated { request, key in
                guard let id = Int64(try request.parameter("id")) else {
                    throw BrokerError.invalidRequest("the delivery id is a number")
                }
                guard
                    try subscriptions.redrive(delivery: id, ownedBy: WebhookSubscriptionStore.owner(key), actor: "api:\(key.id)")
                else {
                    throw BrokerError(.deliveryNotFailed, "only failed deliveries can be re-driven")
                }
                wakeDispatcher()
                return .json(.object(["id": .integer(id), "state": .string(DeliveryState.pending.rawValue)]), status: 202)
            })
    }

    private static func feedRoutes(on router: inout Router, feed: EventFeed) {
        router.get(
            "/v1/events",
            authenticated { request, key in
                let cursor: EventFeed.Cursor
                if let text = request.query["after"], !text.isEmpty {
                    guard let parsed = EventFeed.Cursor(text: text) else {
                        throw BrokerError(.invalidCursor, "the cursor is not one this feed handed out")
                    }
                    cursor = parsed
                } else {
                    cursor = .start
                }
                let limit = try request.limitParameter()
                let page = try feed.page(after: cursor, limit: limit, reach: key.reachArray, groups: key.grantReachArray)
                return .json(.object(["events": .array(page.events), "next_cursor": .string(page.next.text)]))
            })
    }

    static let notFound = BrokerError(.subscriptionNotFound, "no subscription with this id")

    static func subscriptionID(_ request: HTTPRequest) throws -> UUID {
        try request.uuidParameter("id", invalid: .invalidSubscriptionID, naming: "subscription id")
    }
}
