import BrokerCrypto
import Foundation
import HTTPServer
import Observability
import PostgresClient
import StrictJSON

/// The event types the broker writes to its outbox, and so the topics one can subscribe to.
public enum EventTopics {
    public static let all: [String] = [
        "user.created", "user.deletion_requested", "user.deleted", "identity.updated", "identity.linked",
        "consent.revoked", "consent.restored", "email.forwarding_disabled", "email.forwarding_enabled",
    ]
}

/// A webhook subscription as the API shows it (never its secret, except once at creation).
struct WebhookSubscription: Sendable {
    var id: UUID
    var url: String
    var topics: [String]
    var status: String
    var description: String?
    var createdAt: Date

    var json: JSONValue {
        .object([
            "id": .string(id.lowercasedString), "url": .string(url), "topics": .array(topics.map(JSONValue.string)),
            "status": .string(status), "description": description.map(JSONValue.string) ?? .null,
            "created_at": .string(RFC3339.string(from: createdAt)),
        ])
    }
}

/// Webhook subscriptions: URLs, topics and signing secrets (stored encrypted like refresh
/// tokens, because signing needs them in clear).
struct WebhookSubscriptionStore: Sendable {
    let pool: PostgresPool
    let tokenKeys: TokenKeyRing

    /// https anywhere, plain http only to this machine (for local development and tests).
    static func validate(url text: String) throws -> String {
        guard text.utf8.count <= 2048, let url = URL(string: text), let scheme = url.scheme?.lowercased(),
            let host = url.host?.lowercased(), !host.isEmpty, url.user == nil, url.password == nil
        else { throw invalidURL("the URL is not absolute") }
        switch scheme {
        case "https":
            return text
        case "http" where ["127.0.0.1", "localhost", "::1", "[::1]"].contains(host):
            return text
        default:
            throw invalidURL("webhook URLs must use https (plain http only on loopback)")
        }
    }

    static func invalidURL(_ detail: String) -> Problem {
        Problem(status: 400, code: "invalid_webhook_url", title: "Invalid webhook URL", detail: detail)
    }

    static func validate(topics: [String]) throws -> [String] {
        guard !topics.isEmpty, topics.count <= 64 else { throw Problem.badRequest(code: "invalid_topic", "give 1…64 topics") }
        for topic in topics where topic != "*" && !EventTopics.all.contains(topic) {
            throw Problem.badRequest(
                code: "invalid_topic", "unknown topic '\(topic)'; topics are * or " + EventTopics.all.joined(separator: ", "))
        }
        return Array(Set(topics)).sorted()
    }

    static func associatedData(_ id: UUID) -> [UInt8] { Array("webhook_subscriptions|\(id.lowercasedString)".utf8) }

    /// Creates a subscription; returns it and its signing secret (`whsec_…`, shown once).
    func create(url: String, topics: [String], description: String?) throws -> (WebhookSubscription, String) {
        let id = UUID()
        let secret = SecureRandom.bytes(32)
        let sealed = try tokenKeys.seal(secret, associatedData: Self.associatedData(id))
        let topicsJSON = PostgresJSON(text: String(decoding: JSONValue.array(topics.map(JSONValue.string)).serialized(), as: UTF8.self))
        let row = try pool.query(
            """
            INSERT INTO webhook_subscriptions (id, url, topics, secret, key_id, description)
            VALUES (\(id), \(url), \(topicsJSON), \(sealed.sealed), \(sealed.keyID), \(description))
            RETURNING created_at
            """
        ).single()
        let subscription = WebhookSubscription(
            id: id, url: url, topics: topics, status: "active", description: description, createdAt: try row.decode(Date.self, 0))
        return (subscription, "whsec_" + Data(secret).base64EncodedString())
    }

    func list() throws -> [WebhookSubscription] {
        try pool.query("SELECT id, url, topics::text, status, description, created_at FROM webhook_subscriptions ORDER BY created_at")
            .map(Self.subscription)
    }

    func find(_ id: UUID) throws -> WebhookSubscription? {
        try pool.query("SELECT id, url, topics::text, status, description, created_at FROM webhook_subscriptions WHERE id = \(id)")
            .first.map(Self.subscription)
    }

    /// Pauses or resumes; deliveries keep being queued while paused and go out on resume.
    func setStatus(_ id: UUID, _ status: String) throws -> Bool {
        try pool.query("UPDATE webhook_subscriptions SET status = \(status) WHERE id = \(id)").affectedRows == 1
    }

    /// Deletes the subscription and its queued deliveries.
    func delete(_ id: UUID) throws -> Bool {
        try pool.query("DELETE FROM webhook_subscriptions WHERE id = \(id)").affectedRows == 1
    }

    /// The signing secret in clear.
    func secret(sealed: [UInt8], keyID: String, subscriptionID: UUID) throws -> [UInt8] {
        try tokenKeys.open(sealed, keyID: keyID, associatedData: Self.associatedData(subscriptionID))
    }

    private static func subscription(_ row: PostgresRow) throws -> WebhookSubscription {
        let topics = try JSONValue.parse(Array(try row.decode(String.self, 2).utf8)).arrayValue?.compactMap(\.stringValue) ?? []
        return WebhookSubscription(
            id: try row.decode(UUID.self, 0), url: try row.decode(String.self, 1), topics: topics,
            status: try row.decode(String.self, 3), description: try row.decode(String?.self, 4),
            createdAt: try row.decode(Date.self, 5))
    }
}
