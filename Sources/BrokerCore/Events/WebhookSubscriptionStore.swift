import BrokerCrypto
import Foundation
import HTTPClient
import Locking
import Observability
import PostgresClient
import StrictJSON
import Synchronization

/// The event types the broker writes to its outbox, and so the topics one can subscribe to.
public enum EventTopics {
    public static let all: [String] = [
        "user.created", "user.deletion_requested", "user.deleted", "identity.updated", "identity.linked",
        "consent.revoked", "consent.restored", "email.forwarding_disabled", "email.forwarding_enabled",
        "token.invalidated",
    ]
}

/// Whether a subscription receives deliveries (`webhook_subscriptions.status`): while
/// `paused` they are queued and parked, and go out on resume.
package enum SubscriptionStatus: String, Sendable, CaseIterable, PostgresDecodable, PostgresEncodable {
    case active, paused
}

/// A webhook subscription as the API shows it (never its secret, except once at creation).
package struct WebhookSubscription: Sendable {
    var id: UUID
    var url: String
    var topics: [String]
    var status: SubscriptionStatus
    var description: String?
    var createdAt: Date

    package var json: JSONValue {
        .object([
            "id": .string(id.lowercasedString), "url": .string(url), "topics": .array(topics.map(JSONValue.string)),
            "status": .string(status.rawValue), "description": description.map(JSONValue.string) ?? .null,
            "created_at": .string(RFC3339.string(from: createdAt)),
        ])
    }
}

/// Webhook subscriptions: URLs, topics and signing secrets (stored encrypted like refresh
/// tokens, because signing needs them in clear).
package struct WebhookSubscriptionStore: Sendable {
    let pool: PostgresPool
    let tokenKeys: TokenKeyRing
    /// `BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS`: receivers on loopback or private networks
    /// are allowed (the demo and the tests); otherwise only public addresses (SSRF).
    package var allowPrivateNetworks = false
    /// `BROKER_WEBHOOK_MAX_SUBSCRIPTIONS`: more are refused (409 `webhook_subscription_limit`).
    /// Every event's transaction writes one delivery row per matching subscription
    /// (`broker_emit_event`), so this cap is also what bounds a login's fan-out.
    package var maximumSubscriptions = 50
    /// `BROKER_WEBHOOK_MAX_SUBSCRIPTIONS_PER_KEY`: more made by one API key are refused (409
    /// `webhook_subscription_limit`, `limit: per_key`); the console's count only to the total.
    package var maximumSubscriptionsPerKey = 10

    package init(pool: PostgresPool, tokenKeys: TokenKeyRing) {
        self.pool = pool
        self.tokenKeys = tokenKeys
    }

    /// The URLs a subscription may name (`URLRule`), and, unless private networks are
    /// allowed, only those whose host is not localhost, a numeric form or a non-public
    /// literal address (`OutboundAddress.checkHost`). Host names are not resolved here (a
    /// name may not resolve yet); every delivery checks what they resolve to.
    package static func validate(url text: String, allowPrivateNetworks: Bool = true) throws -> String {
        guard text.utf8.count <= URLRule.maximumBytes else { throw invalidURL("the URL is longer than 2048 bytes") }
        guard URLRule.accepts(text) else {
            if text.lowercased().hasPrefix("http://") {
                throw invalidURL("webhook URLs must use https (plain http only to 127.0.0.1, localhost or [::1])")
            }
            throw invalidURL("not an absolute https URL without user info or fragment")
        }
        if !allowPrivateNetworks {
            guard let parts = URLParts(text), parts.scheme == "https" else {
                throw invalidURL("webhook URLs must use https to a public address")
            }
            do {
                try OutboundAddress.checkHost(parts.host)
            } catch let refusal as OutboundAddress.Refusal {
                throw invalidURL("the receiver must be on a public address: \(refusal.description)")
            }
        }
        return text
    }

    /// `validate(url:)` with this store's policy.
    package func validate(url text: String) throws -> String {
        try Self.validate(url: text, allowPrivateNetworks: allowPrivateNetworks)
    }

    static func invalidURL(_ detail: String) -> BrokerError {
        BrokerError(.invalidWebhookURL, detail)
    }

    package static func validate(topics: [String]) throws -> [String] {
        guard !topics.isEmpty, topics.count <= 64 else { throw BrokerError(.invalidTopic, "give 1…64 topics") }
        for topic in topics where topic != "*" && !EventTopics.all.contains(topic) {
            throw BrokerError(
                .invalidTopic, "unknown topic '\(topic)'; topics are * or " + EventTopics.all.joined(separator: ", "))
        }
        return Array(Set(topics)).sorted()
    }

    /// The advisory lock key creators of subscriptions take (an arbitrary constant of ours).
    static let creationLock: Int64 = 0x7768_6b5f_6361_7000

    static func associatedData(_ id: UUID) -> [UInt8] { Array("webhook_subscriptions|\(id.lowercasedString)".utf8) }

    /// Creates a subscription; returns it and its signing secret (`whsec_…`, shown once). A
    /// subscription made by a key limited to some apps belongs to that key and receives only
    /// those apps' events. Every key's subscriptions carry its id (`api_key_id`), so each key
    /// counts against its own cap; only a limited key's own are all it sees.
    package func create(
        url: String, topics: [String], description: String?, actor: String, owner: APIKey? = nil
    ) throws -> (WebhookSubscription, String) {
        let creatorID = owner?.id
        let id = UUID()
        let secret = SecureRandom.bytes(32)
        let sealed = try tokenKeys.seal(secret, associatedData: Self.associatedData(id))
        let topicsJSON = PostgresJSON(
            text: String(decoding: JSONValue.array(topics.map(JSONValue.string)).serialized(), as: UTF8.self))
        let (maximum, perKey) = (maximumSubscriptions, maximumSubscriptionsPerKey)
        let createdAt = try pool.withTransaction { connection in
            // Creators count one at a time (the lock ends with the transaction, so it works
            // through PgBouncer); logins, which only read subscriptions, never wait for it.
            try connection.query("SELECT pg_advisory_xact_lock(\(Self.creationLock))")
            let counts = try connection.query(
                "SELECT count(*) AS total, count(*) FILTER (WHERE api_key_id = \(creatorID)::text) AS own FROM webhook_subscriptions"
            ).single()
            if creatorID != nil, try counts.decode(Int.self, "own") >= perKey {
                throw BrokerError(
                    .webhookSubscriptionLimit,
                    "this API key holds \(perKey) webhook subscriptions, the most one key may hold"
                        + " (BROKER_WEBHOOK_MAX_SUBSCRIPTIONS_PER_KEY); delete one of its own first",
                    extensions: ["limit": "per_key", "maximum": String(perKey)])
            }
            guard try counts.decode(Int.self, "total") < maximum else {
                throw BrokerError(
                    .webhookSubscriptionLimit,
                    "this broker holds at most \(maximum) webhook subscriptions for all keys and the console together"
                        + " (BROKER_WEBHOOK_MAX_SUBSCRIPTIONS); an administrator must delete one first",
                    extensions: ["limit": "total", "maximum": String(maximum)])
            }
            let row = try connection.query(
                """
                INSERT INTO webhook_subscriptions (id, url, topics, secret, key_id, description, api_key_id, client_ids, app_ids)
                VALUES (\(id), \(url), \(topicsJSON), \(sealed.sealed), \(sealed.keyID), \(description), \(creatorID),
                        \(owner?.reachArray), \(owner?.grantReachArray))
                RETURNING created_at
                """
            ).single()
            try Self.audit(connection, actor: actor, action: "webhook_subscription.created", id: id, url: url)
            return try row.decode(Date.self, "created_at")
        }
        let subscription = WebhookSubscription(
            id: id, url: url, topics: topics, status: .active, description: description, createdAt: createdAt)
        return (subscription, "whsec_" + Data(secret).base64EncodedString())
    }

    /// The audit entry names the receiving host only: a URL's path or query may hold a token.
    private static func audit(_ connection: PostgresConnection, actor: String, action: String, id: UUID, url: String? = nil)
        throws
    {
        var detail: [String: JSONValue] = ["subscription_id": .string(id.lowercasedString)]
        if let host = url.flatMap({ URL(string: $0)?.host }) { detail["host"] = .string(host) }
        try AuditLog.record(
            connection, actor: actor, action: action, target: "webhook_subscription:\(id.lowercasedString)", detail: detail)
    }

    /// The id a limited key's own subscriptions carry; nil for an unlimited key, which sees them all.
    package static func owner(_ key: APIKey) -> String? { key.reach == nil ? nil : key.id }

    /// Every subscription, or a limited key's own (`ownedBy`).
    package func list(ownedBy owner: String? = nil) throws -> [WebhookSubscription] {
        try pool.query(
            """
            SELECT id, url, topics::text AS topics, status, description, created_at FROM webhook_subscriptions
            WHERE \(owner)::text IS NULL OR api_key_id = \(owner)::text ORDER BY created_at
            """
        ).map(Self.subscription)
    }

    package func find(_ id: UUID, ownedBy owner: String? = nil) throws -> WebhookSubscription? {
        try pool.query(
            """
            SELECT id, url, topics::text AS topics, status, description, created_at FROM webhook_subscriptions
            WHERE id = \(id) AND (\(owner)::text IS NULL OR api_key_id = \(owner)::text)
            """
        ).first.map(Self.subscription)
    }

    /// Pauses or resumes; deliveries keep being queued while paused and go out on resume.
    /// A paused subscription's deliveries are parked at `next_attempt_at = 'infinity'` (out
    /// of the dispatcher's way); resuming makes them all due at once, in order.
    package func setStatus(_ id: UUID, _ status: SubscriptionStatus, actor: String, ownedBy owner: String? = nil) throws -> Bool {
        try pool.withTransaction { connection in
            guard
                try connection.query(
                    """
                    UPDATE webhook_subscriptions SET status = \(status)
                    WHERE id = \(id) AND (\(owner)::text IS NULL OR api_key_id = \(owner)::text)
                    """
                ).affectedRows == 1
            else { return false }
            try connection.query(
                """
                UPDATE webhook_deliveries
                SET next_attempt_at = CASE WHEN \(status) = 'active' THEN now() ELSE 'infinity' END
                WHERE subscription_id = \(id) AND state = 'pending'
                """)
            try Self.audit(
                connection, actor: actor,
                action: status == .paused ? "webhook_subscription.paused" : "webhook_subscription.resumed", id: id)
            return true
        }
    }

    /// Repairs what a pause or resume racing an event's transaction can leave behind: a
    /// delivery parked for an active subscription (its event saw the old, paused status)
    /// is made due; one due for a paused subscription is parked. Run by the dispatch role
    /// every minute; both statements touch only the rows concerned, through the due index.
    package static func reconcileParkedDeliveries(_ pool: PostgresPool) throws {
        try pool.query(
            """
            UPDATE webhook_deliveries d SET next_attempt_at = now()
            FROM webhook_subscriptions s
            WHERE s.id = d.subscription_id AND s.status = 'active' AND d.state = 'pending' AND d.next_attempt_at = 'infinity'
            """)
        try pool.query(
            """
            UPDATE webhook_deliveries d SET next_attempt_at = 'infinity'
            FROM webhook_subscriptions s
            WHERE s.id = d.subscription_id AND s.status = 'paused' AND d.state = 'pending' AND d.next_attempt_at <= now()
            """)
    }

    /// Deletes the subscription and its queued deliveries.
    package func delete(_ id: UUID, actor: String, ownedBy owner: String? = nil) throws -> Bool {
        try pool.withTransaction { connection in
            guard
                try connection.query(
                    "DELETE FROM webhook_subscriptions WHERE id = \(id) AND (\(owner)::text IS NULL OR api_key_id = \(owner)::text)"
                ).affectedRows == 1
            else { return false }
            try Self.audit(connection, actor: actor, action: "webhook_subscription.deleted", id: id)
            return true
        }
    }

    /// The signing secret in clear.
    func secret(sealed: [UInt8], keyID: String, subscriptionID: UUID) throws -> [UInt8] {
        try tokenKeys.open(sealed, keyID: keyID, associatedData: Self.associatedData(subscriptionID))
    }

    private static func subscription(_ row: PostgresRow) throws -> WebhookSubscription {
        let topics =
            try JSONValue.parse(Array(try row.decode(String.self, "topics").utf8)).arrayValue?.compactMap(\.stringValue) ?? []
        return WebhookSubscription(
            id: try row.decode(UUID.self, "id"), url: try row.decode(String.self, "url"), topics: topics,
            status: try row.decode(SubscriptionStatus.self, "status"), description: try row.decode(String?.self, "description"),
            createdAt: try row.decode(Date.self, "created_at"))
    }
}

/// Whether any subscription is active, remembered for a second: events written by this
/// process wake the dispatchers only when someone will receive them, so a deployment
/// without webhooks pays no claim per login.
package final class ActiveSubscriptionProbe: Sendable {
    private let pool: PostgresPool
    private let answer = Lock<(at: ContinuousClock.Instant, any: Bool)?>(nil)
    private let lifetime = Duration.seconds(1)

    package init(pool: PostgresPool) { self.pool = pool }

    package func anyActive() -> Bool {
        let now = ContinuousClock.now
        if let cached = answer.withLock({ $0 }), now - cached.at < lifetime { return cached.any }
        // On a failed query, assume yes: a needless wake costs one claim, a missed one a delay.
        let any =
            (try? pool.query("SELECT EXISTS (SELECT 1 FROM webhook_subscriptions WHERE status = 'active') AS any_active")
                .single().decode(Bool.self, "any_active")) ?? true
        answer.withLock { $0 = (now, any) }
        return any
    }
}
