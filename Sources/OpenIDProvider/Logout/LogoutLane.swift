import BrokerCrypto
import Deliveries
import Foundation
import HTTPClient
import StrictJSON

/// Back-Channel Logout as a delivery lane (`DeliveryEngine` does the claiming, sending,
/// backoff and dead-lettering): logout tokens (§2.4: iss, aud, iat, exp, jti, sub, sid when
/// the RP asked for sessions, the `events` claim, never a nonce; `typ` logout+jwt) as a form
/// POST (§2.5) to each RP's `backchannel_logout_uri`. The webhook settings and address rules
/// apply; a 400 is final (§2.8). A new delivery wakes the lane at once: the rows are written by
/// `broker_oidc_end_grants` (and the provider's own logout paths), which NOTIFY `wakeChannel`.
package struct LogoutLane: DeliveryLane {
    let store: LogoutDeliveryStore
    let keys: SigningKeys
    let issuer: String

    package init(store: LogoutDeliveryStore, keys: SigningKeys, issuer: String) {
        self.store = store
        self.keys = keys
        self.issuer = issuer
    }

    package var names: DeliveryLaneNames { DeliveryLaneNames(metricPrefix: "oidc_logout", title: "Back-Channel Logout") }
    package var queue: DeliveryQueueStore { store.queue }
    package var wakeChannel: String? { LogoutDeliveryStore.dueChannel }

    package typealias Item = LogoutDeliveryStore.Item

    package func claim(lease: Duration) throws -> ClaimedDelivery<Item>? { try store.claim(lease: lease) }

    /// The event a logout token carries (Back-Channel Logout 1.0 §2.4).
    static let event = "http://schemas.openid.net/event/backchannel-logout"

    func logoutToken(for delivery: Item) throws -> String {
        let now = Int64(Date().timeIntervalSince1970)
        var claims: [String: JSONValue] = [
            "iss": .string(issuer), "aud": .string(delivery.clientID), "iat": .integer(now), "exp": .integer(now + 120),
            "jti": .string(Base64URL.encode(SecureRandom.bytes(16))), "sub": .string(delivery.sub.uuidString.lowercased()),
            "events": .object([Self.event: .object([:])]),
        ]
        if let sid = delivery.sid { claims["sid"] = .string(sid) }
        return try keys.sign(claims, type: "logout+jwt")
    }

    package func request(for delivery: ClaimedDelivery<Item>) throws -> HTTPClientRequest {
        HTTPClientRequest(
            method: "POST", url: delivery.item.url,
            headers: [("Content-Type", "application/x-www-form-urlencoded"), ("User-Agent", "appleid-broker-oidc")],
            body: Array(FormEncoding.encode([("logout_token", try logoutToken(for: delivery.item))]).utf8))
    }

    /// §2.8: 200 OK on success; any 2xx is taken as delivered. 400 is the relying party's
    /// verdict that the logout failed (a token it refuses): final, recorded as `rejected`, not
    /// retried. Anything else is tried again.
    package func verdict(status: Int) -> DeliveryVerdict {
        if status == 400 { return .dead }
        return (200..<300).contains(status) ? .delivered : .retry
    }

    package func receiverFields(_ delivery: ClaimedDelivery<Item>) -> [(String, String)] {
        [("client_id", delivery.item.clientID)]
    }
}
