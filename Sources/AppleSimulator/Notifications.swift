import BrokerCrypto
import Foundation
import HTTPClient
import JOSE
import StrictJSON
import Synchronization

/// A server-to-server notification the simulator signs and posts.
public struct NotificationRequest: Sendable, Codable {
    /// Where to POST it (the broker's notification endpoint).
    public var url: String
    /// `email-disabled`, `email-enabled`, `consent-revoked`, `account-delete` (or any string).
    public var type: String
    public var sub: String
    /// `aud`: the client id (an App ID).
    public var clientID: String
    public var email: String?
    public var isPrivateEmail: Bool?
    /// Milliseconds since 1970 (Apple's unit); default now.
    public var eventTimeMilliseconds: Int64?
    /// Send `event_time` in seconds instead (Apple's documentation sample).
    public var eventTimeInSeconds: Bool?
    /// Send `events` as a JSON object instead of a JSON string.
    public var eventsAsObject: Bool?
    /// A fixed `jti` (to replay); default random.
    public var jti: String?
    /// Leave out `exp` (Apple's documentation sample has none).
    public var omitExpiry: Bool?
    /// A wrong `iss`, for negative tests.
    public var issuer: String?

    public init(url: String, type: String, sub: String, clientID: String) {
        self.url = url
        self.type = type
        self.sub = sub
        self.clientID = clientID
    }

    enum CodingKeys: String, CodingKey {
        case url, type, sub
        case clientID = "client_id"
        case email
        case isPrivateEmail = "is_private_email"
        case eventTimeMilliseconds = "event_time_ms"
        case eventTimeInSeconds = "event_time_in_seconds"
        case eventsAsObject = "events_as_object"
        case jti
        case omitExpiry = "omit_exp"
        case issuer = "iss"
    }
}

/// What happened when the simulator posted a notification.
public struct NotificationResult: Sendable, Codable {
    /// The receiver's HTTP status, or 0 when it could not be reached.
    public var status: Int
    public var jti: String
    /// The signed JWS that was posted (to replay it).
    public var payload: String
}

extension AppleSimulator {
    /// The signed `payload` JWS of a notification, shaped like Apple's: `events` is a JSON
    /// *string*, `event_time` is in milliseconds, `is_private_email` is a string.
    public func signNotification(_ request: NotificationRequest) throws -> (jti: String, payload: String) {
        let now = Int64(Date().timeIntervalSince1970)
        let jti = request.jti ?? Base64URL.encode(SecureRandom.bytes(16))
        var eventTime = request.eventTimeMilliseconds ?? now * 1000
        if request.eventTimeInSeconds == true { eventTime /= 1000 }
        var event: [String: JSONValue] = [
            "type": .string(request.type), "sub": .string(request.sub), "event_time": .integer(eventTime),
        ]
        if let email = request.email { event["email"] = .string(email) }
        if let isPrivateEmail = request.isPrivateEmail { event["is_private_email"] = .string(isPrivateEmail ? "true" : "false") }
        let eventsJSON = JSONValue.object(event)
        var claims: [String: JSONValue] = [
            // Apple names the group's primary App ID (forum 655485; protocol reference §10.2).
            "iss": .string(request.issuer ?? Self.issuer), "aud": .string(primaryAppID(of: request.clientID)),
            "iat": .integer(now),
            "jti": .string(jti),
            "events": request.eventsAsObject == true
                ? eventsJSON : .string(String(decoding: eventsJSON.serialized(), as: UTF8.self)),
        ]
        if request.omitExpiry != true { claims["exp"] = .integer(now + 86_400) }
        return (jti, try signWithCurrentKey(claims))
    }

    /// Signs arbitrary claims with Apple's current key (negative tests: a well-signed JWS
    /// whose content is wrong).
    public func signClaims(_ claims: [String: JSONValue]) throws -> String {
        try signWithCurrentKey(claims)
    }

    /// Signs a notification and POSTs `{"payload": "<JWS>"}` to `request.url`.
    public func sendNotification(_ request: NotificationRequest) throws -> NotificationResult {
        let (jti, payload) = try signNotification(request)
        let body = JSONValue.object(["payload": .string(payload)]).serialized()
        let status: Int
        do {
            status = try transport.send(
                .init(
                    method: "POST", url: request.url, headers: [("Content-Type", "application/json")], body: body,
                    timeout: .seconds(10))
            ).status
        } catch {
            status = 0
        }
        return NotificationResult(status: status, jti: jti, payload: payload)
    }
}
