import Foundation
import HTTPClient
import Workers

/// One kind of outbound delivery (webhooks, Back-Channel Logout): its table, what it sends
/// and its rules. The `DeliveryEngine` does the rest, the same for every lane: claim under a
/// lease, address checks and pinning, the attempt, backoff, dead letter, metrics.
package protocol DeliveryLane: Sendable {
    /// What a claimed row carries besides the queue's columns (URL, payload, keys…).
    associatedtype Item: Sendable

    /// Names for metrics and logs.
    var names: DeliveryLaneNames { get }
    /// The lane's table, as its owning store names it.
    var queue: DeliveryQueueStore { get }
    /// A `NOTIFY` channel on which new rows announce themselves (the listener wakes the lane);
    /// nil when only this process's writers wake it (and other processes' rows wait for a poll).
    var wakeChannel: String? { get }

    /// The next due delivery, leased (the lane's order: oldest due first, or its own).
    func claim(lease: Duration) throws -> ClaimedDelivery<Item>?
    /// The request for one attempt; the engine adds the timeout and the pinned addresses.
    /// Throw a `DeliveryFailure` for a reason of the lane's (a secret it cannot open).
    func request(for delivery: ClaimedDelivery<Item>) throws -> HTTPClientRequest
    /// The lane's rule for a receiver's answer: delivered, try again, or final.
    func verdict(status: Int) -> DeliveryVerdict
    /// Log fields naming the delivery's receiver when its address is refused (ids, never URLs).
    func receiverFields(_ delivery: ClaimedDelivery<Item>) -> [(String, String)]
}

extension DeliveryLane {
    package var wakeChannel: String? { nil }

    /// Any 2xx is delivered; anything else (redirects are not followed) is tried again.
    package func verdict(status: Int) -> DeliveryVerdict { (200..<300).contains(status) ? .delivered : .retry }

    package func receiverFields(_ delivery: ClaimedDelivery<Item>) -> [(String, String)] { [("delivery", String(delivery.id))] }
}

/// A lane's metric prefix and the words its metric help texts use.
package struct DeliveryLaneNames: Sendable {
    /// `webhook` gives `webhook_deliveries_total`, `webhook_backlog`, `webhook_dead_letters`, …
    package var metricPrefix: String
    /// "Webhook", "Back-Channel Logout".
    package var title: String

    package init(metricPrefix: String, title: String) {
        self.metricPrefix = metricPrefix
        self.title = title
    }
}

/// A claimed row: the queue's columns and the lane's item.
package struct ClaimedDelivery<Item: Sendable>: Sendable {
    package var id: Int64
    /// This attempt's number (the claim counted it).
    package var attempts: Int
    package var createdAt: Date
    package var item: Item

    package init(id: Int64, attempts: Int, createdAt: Date, item: Item) {
        self.id = id
        self.attempts = attempts
        self.createdAt = createdAt
        self.item = item
    }
}

/// What an answer means for a delivery, by its lane's rule.
package enum DeliveryVerdict: Sendable, Equatable {
    case delivered
    /// Try again after the backoff (until the maximum age).
    case retry
    /// Final by the receiver's word (Back-Channel Logout's 400): a dead letter at once, never
    /// tried again unless re-driven; `last_error` says `rejected`.
    case dead
}

/// What `last_error` says about a failed attempt: a category, never connect details
/// (addresses, ports, TLS or resolver messages would make deliveries a scanner's oracle).
/// With private networks refused, a host that does not resolve, resolves too slowly or
/// resolves to a private address is one category, `address_not_allowed`: telling them
/// apart would let a receiver map the internal DNS (which names exist inside).
/// `dns_failed` is no longer written (rows from earlier releases may hold it).
package enum DeliveryFailure: String, Error, Sendable {
    case addressNotAllowed = "address_not_allowed"
    case dnsFailed = "dns_failed"
    case timeout
    case connectionFailed = "connection_failed"
    case connectionClosed = "connection_closed"
    case responseTooLarge = "response_too_large"
    case invalidURL = "invalid_url"
    case transportError = "transport_error"
    case httpStatus = "http_status"
    /// The lane's rule made the answer final (`DeliveryVerdict.dead`).
    case rejected
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

/// How patiently a lane delivers (`BROKER_WEBHOOK_*`, which Back-Channel Logout follows too).
package struct DeliverySettings: Sendable {
    /// Limit for one attempt.
    package var timeout: Duration
    /// Between attempts.
    package var backoff: Backoff
    /// A delivery still not made this long after it was queued is a dead letter.
    package var maximumAge: Duration
    /// Longer than `dnsTimeout` + `timeout` (checked at configuration load), or a slow
    /// delivery's lease ends mid-flight and another lane sends it again.
    package var lease: Duration
    package var dnsTimeout: Duration
    /// Receivers on loopback and private networks are allowed (tests, the demo); off, each
    /// attempt resolves the host, refuses non-public addresses and pins what it checked.
    package var allowPrivateNetworks: Bool

    package init(
        timeout: Duration = .seconds(5), backoff: Backoff = Backoff(first: .seconds(1), maximum: .seconds(3600)),
        maximumAge: Duration = .seconds(86_400), lease: Duration = .seconds(60), dnsTimeout: Duration = .seconds(2),
        allowPrivateNetworks: Bool = false
    ) {
        self.timeout = timeout
        self.backoff = backoff
        self.maximumAge = maximumAge
        self.lease = lease
        self.dnsTimeout = dnsTimeout
        self.allowPrivateNetworks = allowPrivateNetworks
    }
}
