import BrokerCore
import BrokerCrypto
import Foundation
import HTTPClient
import Observability
import StrictJSON
import Workers

/// Sends Back-Channel Logout 1.0 logout tokens (§2.4: iss, aud, iat, exp, jti, sub, sid when
/// the RP asked for sessions, the `events` claim, never a nonce; `typ` logout+jwt) as a form
/// POST (§2.5) to each RP's `backchannel_logout_uri`. One delivery per step; the webhook
/// settings and address rules apply: retried with exponential backoff and jitter, `failed`
/// after the maximum age, receivers on private networks only when allowed (resolved and pinned).
package final class LogoutDispatcher: Sendable {
    let store: LogoutDeliveryStore
    let keys: SigningKeys
    let issuer: String
    let transport: any HTTPTransport
    let settings: BrokerConfiguration.DispatchSettings
    let resolver: ReceiverResolver
    let logger: Logger
    private let outcomes: CounterFamily

    package init(
        store: LogoutDeliveryStore, keys: SigningKeys, issuer: String, transport: any HTTPTransport,
        settings: BrokerConfiguration.DispatchSettings, metrics: MetricsRegistry, logger: Logger
    ) {
        self.store = store
        self.keys = keys
        self.issuer = issuer
        self.transport = transport
        self.settings = settings
        self.logger = logger
        resolver = ReceiverResolver(timeout: settings.dnsTimeout)
        outcomes = metrics.counter(
            "oidc_logout_deliveries_total", help: "Back-Channel Logout delivery attempts by outcome: delivered, retry, failed.",
            labels: ["outcome"])
        metrics.collect {
            guard let backlog = try? store.backlog() else { return [] }
            return [
                CollectedSample(
                    name: "oidc_logout_backlog", help: "Back-Channel Logout deliveries waiting (first try or retry).",
                    value: backlog.pending),
                CollectedSample(
                    name: "oidc_logout_dead_letters", help: "Back-Channel Logout deliveries that failed for good.",
                    value: backlog.failed),
            ]
        }
    }

    /// The event a logout token carries (Back-Channel Logout 1.0 §2.4).
    static let event = "http://schemas.openid.net/event/backchannel-logout"

    func logoutToken(for delivery: LogoutDeliveryStore.Claimed) throws -> String {
        let now = Int64(Date().timeIntervalSince1970)
        var claims: [String: JSONValue] = [
            "iss": .string(issuer), "aud": .string(delivery.clientID), "iat": .integer(now), "exp": .integer(now + 120),
            "jti": .string(Base64URL.encode(SecureRandom.bytes(16))), "sub": .string(delivery.sub.uuidString.lowercased()),
            "events": .object([Self.event: .object([:])]),
        ]
        if let sid = delivery.sid { claims["sid"] = .string(sid) }
        return try keys.sign(claims, type: "logout+jwt")
    }

    /// One delivery; false when none is due.
    package func step() throws -> Bool {
        guard let delivery = try store.claim(lease: settings.lease) else { return false }
        var status = 0
        var failure: String?
        do {
            var request = HTTPClientRequest(
                method: "POST", url: delivery.url,
                headers: [("Content-Type", "application/x-www-form-urlencoded"), ("User-Agent", "appleid-broker-oidc")],
                body: Array(FormEncoding.encode([("logout_token", try logoutToken(for: delivery))]).utf8),
                timeout: settings.timeout)
            if !settings.allowPrivateNetworks {
                guard let parts = URLParts(delivery.url) else { throw Refusal.invalidURL }
                do {
                    request.pinnedAddresses = try resolver.publicAddresses(of: parts.host)
                } catch {
                    throw Refusal.addressNotAllowed
                }
            }
            status = try transport.send(request).status
            // §2.8: 200 OK on success; any 2xx is taken as delivered.
            if !(200..<300).contains(status) { failure = "http_status" }
        } catch let refusal as Refusal {
            failure = refusal.rawValue
        } catch let error as HTTPClientError {
            failure = error.code == .timeout ? "timeout" : "connection_failed"
        } catch {
            failure = "transport_error"
        }
        if let failure {
            let expired = Date().timeIntervalSince(delivery.createdAt) > Double(settings.maximumAge.components.seconds)
            let delay = settings.retryBackoff.delay(after: delivery.attempts)
            try store.recordFailure(
                delivery.id, expired: expired, delayMilliseconds: Int(delay.wholeMilliseconds),
                status: status == 0 ? nil : status,
                error: failure)
            outcomes.increment(expired ? "failed" : "retry")
        } else {
            try store.recordDelivered(delivery.id, status: status)
            outcomes.increment("delivered")
        }
        return true
    }

    enum Refusal: String, Error {
        case invalidURL = "invalid_url"
        case addressNotAllowed = "address_not_allowed"
    }
}
