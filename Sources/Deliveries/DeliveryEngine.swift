import Foundation
import HTTPClient
import Observability
import Workers

/// Delivers one lane's rows, at least once: lanes of threads (a `WorkerGroup` running
/// `step`) claim due rows under a lease, so a killed process loses nothing and two lanes
/// never send one row at once. Each attempt resolves and pins the receiver's public
/// addresses (unless private networks are allowed), sends the lane's request, and asks the
/// lane's rule what the answer means: delivered, retried after the backoff until the maximum
/// age, or dead at once. Dead letters stay until re-driven (`DeliveryQueueStore.redrive`) or
/// pruned.
///
/// Metrics, per lane prefix: `<prefix>_deliveries_total{outcome}` (delivered, retry,
/// failed), `<prefix>_delivery_duration_seconds`, `<prefix>_backlog`,
/// `<prefix>_dead_letters`, `<prefix>_oldest_pending_age_seconds`.
package final class DeliveryEngine<Lane: DeliveryLane>: Sendable {
    package let lane: Lane
    let transport: any HTTPTransport
    let settings: DeliverySettings
    let resolver: ReceiverResolver
    let logger: Logger
    private let outcomes: CounterFamily
    private let latency: HistogramFamily

    package init(
        lane: Lane, transport: any HTTPTransport, settings: DeliverySettings, metrics: MetricsRegistry, logger: Logger,
        resolver: ReceiverResolver? = nil
    ) {
        self.lane = lane
        self.transport = transport
        self.settings = settings
        self.logger = logger
        self.resolver = resolver ?? ReceiverResolver(timeout: settings.dnsTimeout)
        let prefix = lane.names.metricPrefix
        let title = lane.names.title
        outcomes = metrics.counter(
            "\(prefix)_deliveries_total", help: "\(title) delivery attempts by outcome: delivered, retry, failed.",
            labels: ["outcome"])
        latency = metrics.histogram("\(prefix)_delivery_duration_seconds", help: "Latency of \(title) delivery attempts.")
        let queue = lane.queue
        metrics.collect {
            guard let backlog = try? queue.backlog() else { return [] }
            return [
                CollectedSample(
                    name: "\(prefix)_backlog", help: "\(title) deliveries waiting (first try or retry).", value: backlog.pending),
                CollectedSample(
                    name: "\(prefix)_dead_letters", help: "\(title) deliveries that failed for good.", value: backlog.deadLetters),
                CollectedSample(
                    name: "\(prefix)_oldest_pending_age_seconds", help: "Age of the oldest waiting \(title) delivery.",
                    value: backlog.oldestPendingAgeSeconds),
            ]
        }
    }

    /// One delivery per call (the engine runs as several lanes); false when none is due.
    package func step() throws -> Bool {
        guard let delivery = try lane.claim(lease: settings.lease) else { return false }
        deliver(delivery)
        return true
    }

    /// One attempt and its outcome, recorded.
    func deliver(_ delivery: ClaimedDelivery<Lane.Item>) {
        let started = ContinuousClock.now
        let (status, failure) = attempt(delivery)
        latency.observe((ContinuousClock.now - started).seconds)
        // An answer is judged by the lane's rule; no answer is tried again.
        var verdict = failure == nil ? lane.verdict(status: status) : .retry
        let error = failure ?? (verdict == .dead ? .rejected : .httpStatus)
        if verdict == .retry, Date().timeIntervalSince(delivery.createdAt) > settings.maximumAge.seconds { verdict = .dead }
        do {
            switch verdict {
            case .delivered:
                try lane.queue.recordDelivered(delivery.id, status: status)
                outcomes.increment("delivered")
            case .retry, .dead:
                try lane.queue.recordFailure(
                    delivery.id, dead: verdict == .dead, delay: settings.backoff.delay(after: delivery.attempts),
                    status: status == 0 ? nil : status, error: error.rawValue)
                outcomes.increment(verdict == .dead ? "failed" : "retry")
            }
        } catch {
            // The lease brings the delivery back; the receiver may see it twice (at least once).
            logger.warning("could not record a delivery outcome", [("error", "\(error)")])
        }
        if failure == .addressNotAllowed {
            logger.warning(
                "\(lane.names.title) receiver refused: its host is not, or does not resolve (in time) to, a public address",
                lane.receiverFields(delivery))
        }
    }

    /// Sends one attempt: the receiver's status, or 0 and why none came back.
    private func attempt(_ delivery: ClaimedDelivery<Lane.Item>) -> (status: Int, failure: DeliveryFailure?) {
        do {
            var request = try lane.request(for: delivery)
            request.timeout = settings.timeout
            if !settings.allowPrivateNetworks {
                // Resolved here, every time, and the connection pinned to what was checked.
                guard let parts = URLParts(request.url) else { throw DeliveryFailure.invalidURL }
                do {
                    request.pinnedAddresses = try resolver.publicAddresses(of: parts.host)
                } catch is OutboundAddress.Refusal {
                    throw DeliveryFailure.addressNotAllowed
                } catch is ReceiverResolver.Failure {
                    throw DeliveryFailure.addressNotAllowed
                }
            }
            return (try transport.send(request).status, nil)
        } catch let failure as DeliveryFailure {
            return (0, failure)
        } catch let error as HTTPClientError {
            return (0, DeliveryFailure(error))
        } catch {
            return (0, .transportError)
        }
    }
}
