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
        /// Longer than `dnsTimeout` + `timeout` (checked at configuration load), or a slow
        /// delivery's lease ends mid-flight and another lane sends it again.
        var lease: Duration
        var dnsTimeout: Duration

        package init(
            timeout: Duration = .seconds(5), retryBase: Duration = .seconds(1), retryMaximum: Duration = .seconds(3600),
            maximumAge: Duration = .seconds(86_400), lease: Duration = .seconds(60), dnsTimeout: Duration = .seconds(2)
        ) {
            self.timeout = timeout
            self.retryBase = retryBase
            self.retryMaximum = retryMaximum
            self.maximumAge = maximumAge
            self.lease = lease
            self.dnsTimeout = dnsTimeout
        }
    }

    let deliveries: WebhookDeliveryStore
    let subscriptions: WebhookSubscriptionStore
    let transport: any HTTPTransport
    let settings: Settings
    let logger: Logger
    let resolver: ReceiverResolver
    private let outcomes: CounterFamily
    private let latency: HistogramFamily

    package init(
        pool: PostgresPool, subscriptions: WebhookSubscriptionStore, transport: any HTTPTransport, settings: Settings,
        metrics: MetricsRegistry, logger: Logger
    ) {
        deliveries = WebhookDeliveryStore(pool: pool)
        self.subscriptions = subscriptions
        self.transport = transport
        self.settings = settings
        self.logger = logger
        resolver = ReceiverResolver(timeout: settings.dnsTimeout)
        outcomes = metrics.counter(
            "webhook_deliveries_total", help: "Webhook delivery attempts by outcome: delivered, retry, failed.",
            labels: ["outcome"])
        latency = metrics.histogram("webhook_delivery_duration_seconds", help: "Latency of webhook delivery attempts.")
        let store = deliveries
        metrics.collect {
            guard let backlog = try? store.backlog() else { return [] }
            return [
                CollectedSample(
                    name: "webhook_backlog", help: "Webhook deliveries waiting (first try or retry).", value: backlog.pending),
                CollectedSample(
                    name: "webhook_dead_letters", help: "Webhook deliveries that failed for good.", value: backlog.deadLetters),
                CollectedSample(
                    name: "webhook_oldest_pending_age_seconds", help: "Age of the oldest waiting webhook delivery.",
                    value: backlog.oldestPendingAgeSeconds),
            ]
        }
    }

    typealias Claimed = WebhookDeliveryStore.Claimed

    /// One delivery per call (the dispatcher runs as several lanes).
    package func step() throws -> Bool {
        guard let delivery = try claim() else { return false }
        deliver(delivery)
        return true
    }

    func claim() throws -> Claimed? {
        try deliveries.claim(lease: settings.lease)
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
    /// With private networks refused, a host that does not resolve, resolves too slowly or
    /// resolves to a private address is one category, `address_not_allowed`: telling them
    /// apart would let a subscriber map the internal DNS (which names exist inside).
    /// `dns_failed` is no longer written (rows from earlier releases may hold it).
    enum Failure: String, Error {
        case addressNotAllowed = "address_not_allowed"
        case dnsFailed = "dns_failed"
        case timeout
        case connectionFailed = "connection_failed"
        case connectionClosed = "connection_closed"
        case responseTooLarge = "response_too_large"
        case invalidURL = "invalid_url"
        case transportError = "transport_error"
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
                secret = try subscriptions.secret(
                    sealed: delivery.secret, keyID: delivery.keyID, subscriptionID: delivery.subscriptionID)
            } catch {
                throw Failure.secretUnreadable
            }
            var request = Self.request(
                delivery, secret: secret, timestamp: Int(Date().timeIntervalSince1970), timeout: settings.timeout)
            if !subscriptions.allowPrivateNetworks {
                // Resolved here, every time, and the connection pinned to what was checked.
                guard let parts = URLParts(delivery.url) else { throw Failure.invalidURL }
                do {
                    request.pinnedAddresses = try resolver.publicAddresses(of: parts.host)
                } catch is OutboundAddress.Refusal {
                    throw Failure.addressNotAllowed
                } catch is ReceiverResolver.Failure {
                    throw Failure.addressNotAllowed
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
                let delay = Backoff(first: settings.retryBase, maximum: settings.retryMaximum).delay(after: delivery.attempts)
                try deliveries.recordFailure(
                    delivery.id, expired: expired, delayMilliseconds: Int(delay.wholeMilliseconds),
                    status: status == 0 ? nil : status,
                    error: failure.rawValue)
                outcomes.increment(expired ? "failed" : "retry")
            } else {
                try deliveries.recordDelivered(delivery.id, status: status)
                outcomes.increment("delivered")
            }
            if failure == .addressNotAllowed {
                logger.warning(
                    "webhook receiver refused: its host is not, or does not resolve (in time) to, a public address",
                    [("subscription", delivery.subscriptionID.lowercasedString)])
            }
        } catch {
            // The lease brings the delivery back; the receiver may see it twice (at least once).
            logger.warning("could not record a delivery outcome", [("error", "\(error)")])
        }
    }
}
