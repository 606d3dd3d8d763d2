import BrokerCrypto
import Foundation
import StrictJSON

/// Verifies the broker's webhook deliveries (Standard Webhooks): `webhook-signature` holds
/// `v1,<base64 HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}">` entries under the
/// subscription's secret (`whsec_…`, shown once at creation), and `webhook-timestamp` must be
/// recent so that a captured delivery cannot be replayed later. HMAC comes from OpenSSL
/// (BrokerCrypto), compared in constant time.
public struct WebhookVerifier: Sendable {
    /// Why a delivery was refused.
    public enum Failure: Error, Sendable, Equatable {
        case missingHeaders
        case staleTimestamp
        case badSignature
    }

    private let key: [UInt8]
    /// How far `webhook-timestamp` may be from now.
    public var tolerance: TimeInterval = 300

    /// - Parameter secret: the subscription's `whsec_…` secret.
    public init?(secret: String) {
        let encoded = secret.hasPrefix("whsec_") ? String(secret.dropFirst(6)) : secret
        guard let key = Data(base64Encoded: encoded), !key.isEmpty else { return nil }
        self.key = Array(key)
    }

    /// The delivery's event, once its signature and timestamp check out.
    /// - Parameter header: looks a request header up by name (any case).
    @discardableResult
    public func verify(body: [UInt8], header: (String) -> String?, now: Date = Date()) throws -> Delivery {
        guard let id = header("webhook-id"), let timestamp = header("webhook-timestamp"),
            let signatures = header("webhook-signature"),
            let seconds = TimeInterval(timestamp)
        else { throw Failure.missingHeaders }
        guard abs(now.timeIntervalSince1970 - seconds) <= tolerance else { throw Failure.staleTimestamp }
        let expected = HMACSHA256.authenticate(Array("\(id).\(timestamp).".utf8) + body, key: key)
        let matches = signatures.split(separator: " ").contains { entry in
            let parts = entry.split(separator: ",", maxSplits: 1)
            guard parts.count == 2, parts[0] == "v1", let given = Data(base64Encoded: String(parts[1])) else { return false }
            return ConstantTime.equals(Array(given), expected)
        }
        guard matches else { throw Failure.badSignature }
        var delivery = try JSONDecoder().decode(Delivery.self, from: Data(body))
        delivery.webhookID = id
        return delivery
    }

    /// A verified delivery: `{id, type, timestamp, data}`. Deduplicate on `webhookID` (the same
    /// for every retry); `eventID` is the event's id in the pull feed.
    public struct Delivery: Sendable, Decodable {
        public var webhookID = ""
        public var eventID: String
        public var type: String
        public var timestamp: String
        /// The event's fields; `user_id` always, never personal data.
        public var data: [String: JSONValue]

        enum CodingKeys: String, CodingKey {
            case eventID = "id"
            case type, timestamp, data
        }
    }
}
