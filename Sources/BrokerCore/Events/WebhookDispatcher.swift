import BrokerCrypto
import Foundation
import HTTPClient
import Observability
import PostgresClient
import StrictJSON
import Workers

/// Delivers outbox events to webhook subscribers, Standard Webhooks style: a JSON body
/// `{id, type, timestamp, data}` (`id` as in the pull feed) and headers `webhook-id` (stable per event and subscription, so
/// receivers can deduplicate), `webhook-timestamp` and
/// `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`.
///
/// At least once: a delivery row per (event, subscription) is written in the transaction
/// that wrote the event; lanes of threads claim due rows with `FOR UPDATE SKIP LOCKED` and a
/// lease, so a killed dispatcher loses nothing. A row is claimable only at the head of its
/// (subscription, user) queue, so one user's events reach each subscriber in order while
/// different users go in parallel. 2xx is delivered; anything else (redirects are not
/// followed), a timeout or a broken connection is retried with exponential backoff and
/// jitter until the delivery is older than the maximum age, then it is `failed`.
package final class WebhookDispatcher: Sendable {
    package struct Settings: Sendable {
        var timeout: Duration
        var retryBase: Duration
        var retryMaximum: Duration
        var maximumAge: Duration
        var lease: Duration

        package init(
            timeout: Duration = .seconds(5), retryBase: Duration = .seconds(1), retryMaximum: Duration = .seconds(3600),
            maximumAge: Duration = .seconds(86_400), lease: Duration = .seconds(60)
        ) {
            self.timeout = timeout
            self.retryBase = retryBase
            self.retryMaximum = retryMaximum
            self.maximumAge = maximumAge
            self.lease = lease
        }
    }

    let pool: PostgresPool
    let subscriptions: WebhookSubscriptionStore
    let transport: any HTTPTransport
    let settings: Settings
    let logger: Logger
    private let outcomes: CounterFamily
    private let latency: HistogramFamily

    package init(
        pool: PostgresPool, subscriptions: WebhookSubscriptionStore, transport: any HTTPTransport, settings: Settings,
        metrics: MetricsRegistry, logger: Logger
    ) {
        self.pool = pool
        self.subscriptions = subscriptions
        self.transport = transport
        self.settings = settings
        self.logger = logger
        outcomes = metrics.counter(
            "webhook_deliveries_total", help: "Webhook delivery attempts by outcome: delivered, retry, failed.",
            labels: ["outcome"])
        latency = metrics.histogram("webhook_delivery_duration_seconds", help: "Latency of webhook delivery attempts.")
        metrics.collect {
            guard let row = try? pool.query(
                """
                SELECT count(*) FILTER (WHERE state = 'pending') AS backlog, count(*) FILTER (WHERE state = 'failed') AS dead_letters,
                       COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE state = 'pending')), 0) AS oldest_age
                FROM webhook_deliveries
                """
            ).first else { return [] }
            return [
                CollectedSample(
                    name: "webhook_backlog", help: "Webhook deliveries waiting (first try or retry).",
                    value: (try? row.decode(Double.self, "backlog")) ?? 0),
                CollectedSample(
                    name: "webhook_dead_letters", help: "Webhook deliveries that failed for good.",
                    value: (try? row.decode(Double.self, "dead_letters")) ?? 0),
                CollectedSample(
                    name: "webhook_oldest_pending_age_seconds", help: "Age of the oldest waiting webhook delivery.",
                    value: (try? row.decode(Double.self, "oldest_age")) ?? 0),
            ]
        }
    }

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

    /// One delivery per call (the dispatcher runs as several lanes).
    package func step() throws -> Bool {
        guard let delivery = try claim() else { return false }
        deliver(delivery)
        return true
    }

    func claim() throws -> Claimed? {
        let lease = Int(settings.lease.components.seconds)
        // sql/0005_webhook_claim.sql: the claim's plan is pinned there (why is told there too).
        guard let row = try pool.query(
            "SELECT * FROM broker_claim_webhook_delivery(\(String(lease) + " seconds")::interval)"
        ).first else { return nil }
        return Claimed(
            id: try row.decode(Int64.self, "delivery_id"), attempts: try row.decode(Int.self, "attempts"), createdAt: try row.decode(Date.self, "delivery_created_at"),
            eventID: try row.decode(Int64.self, "event_id"), type: try row.decode(String.self, "event_type"), payload: try row.decode(String.self, "payload"),
            eventCreatedAt: try row.decode(Date.self, "event_created_at"), subscriptionID: try row.decode(UUID.self, "subscription_id"),
            url: try row.decode(String.self, "url"), secret: try row.decode([UInt8].self, "secret"), keyID: try row.decode(String.self, "key_id"))
    }

    /// The Standard Webhooks message id: stable for this event and subscription.
    static func messageID(eventID: Int64, subscriptionID: UUID) -> String {
        "msg_\(eventID)_" + subscriptionID.lowercasedString.replacingOccurrences(of: "-", with: "")
    }

    /// The signed request for one delivery.
    static func request(
        _ delivery: Claimed, secret: [UInt8], timestamp: Int, timeout: Duration
    ) -> HTTPClientRequest {
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
            body: body, timeout: timeout)
    }

    /// What `last_error` says about a failed attempt: a category, never connect details
    /// (addresses, ports, TLS or resolver messages would make deliveries a scanner's oracle).
    enum Failure: String, Error {
        case addressNotAllowed = "address_not_allowed"
        case dnsFailed = "dns_failed"
        case timeout, connectionFailed = "connection_failed", connectionClosed = "connection_closed"
        case responseTooLarge = "response_too_large", invalidURL = "invalid_url", transportError = "transport_error"
        case httpStatus = "http_status"
        case secretUnreadable = "secret_unreadable"

        init(_ error: HTTPClientError) {
            self =
                switch error.code {
                case .timeout: .timeout
                case .connectionFailed: .connectionFailed
                case .connectionClosed: .connectionClosed
                case .responseTooLarge: .responseTooLarge
                case .invalidURL: .invalidURL
                default: .transportError
                }
        }
    }

    private func deliver(_ delivery: Claimed) {
        let started = ContinuousClock.now
        var status = 0
        var failure: Failure?
        do {
            let secret: [UInt8]
            do {
                secret = try subscriptions.secret(sealed: delivery.secret, keyID: delivery.keyID, subscriptionID: delivery.subscriptionID)
            } catch {
                throw Failure.secretUnreadable
            }
            var request = Self.request(delivery, secret: secret, timestamp: Int(Date().timeIntervalSince1970), timeout: settings.timeout)
            if !subscriptions.allowPrivateNetworks {
                // Resolved here, every time, and the connection pinned to what was checked.
                guard let parts = URLParts(delivery.url) else { throw Failure.invalidURL }
                do {
                    request.pinnedAddresses = try OutboundAddress.publicAddresses(of: parts.host)
                } catch let refusal as OutboundAddress.Refusal {
                    throw refusal.unresolvable ? Failure.dnsFailed : Failure.addressNotAllowed
                }
            }
            status = try transport.send(request).status
            if !(200..<300).contains(status) { failure = .httpStatus }
        } catch let category as Failure {
            failure = category
        } catch let transportError as HTTPClientError {
            failure = Failure(transportError)
        } catch {
            failure = .transportError
        }
        latency.observe((ContinuousClock.now - started).seconds)
        do {
            if let failure {
                let expired = Date().timeIntervalSince(delivery.createdAt) > settings.maximumAge.seconds
                let cap = min(settings.retryBase.seconds * pow(2, Double(min(delivery.attempts - 1, 30))), settings.retryMaximum.seconds)
                let delay = Int(Double.random(in: cap / 2...max(cap / 2, cap)) * 1000)
                try pool.query(
                    """
                    UPDATE webhook_deliveries SET
                        state = CASE WHEN \(expired) THEN 'failed' ELSE 'pending' END,
                        next_attempt_at = now() + \(String(delay) + " milliseconds")::interval,
                        last_status = \(status == 0 ? nil : status), last_error = \(failure.rawValue)
                    WHERE id = \(delivery.id)
                    """)
                outcomes.increment(expired ? "failed" : "retry")
            } else {
                try pool.query(
                    """
                    UPDATE webhook_deliveries SET state = 'delivered', delivered_at = now(), last_status = \(status), last_error = NULL
                    WHERE id = \(delivery.id)
                    """)
                outcomes.increment("delivered")
            }
            if failure == .addressNotAllowed {
                logger.warning("webhook receiver refused: not a public address", [("subscription", delivery.subscriptionID.lowercasedString)])
            }
        } catch {
            // The lease brings the delivery back; the receiver may see it twice (at least once).
            logger.warning("could not record a delivery outcome", [("error", "\(error)")])
        }
    }
}
