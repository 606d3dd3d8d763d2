import AppleID
import BrokerCrypto
import Foundation
import JOSE
import Observability
import PostgresClient
import StrictJSON

/// One server-to-server notification, as Apple's verified JWS says it.
public struct AppleNotification: Sendable, Equatable {
    public var jti: String
    /// `email-disabled`, `email-enabled`, `consent-revoked`, `account-delete` (or `account-deleted`), or a type we do not know.
    public var type: String
    public var sub: String
    public var eventTime: Date
    /// The `aud` that matched one of ours: the group's primary App ID in Apple's notifications.
    public var audience: String
    /// Email events' `email` and `is_private_email` (string or boolean), when sent.
    public var email: String? = nil
    public var isPrivateEmail: Bool? = nil
}

/// Apple's server-to-server notifications (`POST /v1/apple/notifications`), verified before
/// anything is acted on, deduplicated by `jti`, applied exactly once in one transaction
/// with their outbox events, and answered 200 only once durable (duplicates, unknown
/// subjects and unknown types included, so Apple stops retrying). A JWS that fails
/// verification is 401 and stores nothing; a database outage is 503 so Apple retries.
public final class NotificationReceiver: Sendable {
    let verifier: AppleTokenVerifier
    /// Which client ids share an authorization; a notification applies to its `aud`'s group.
    let groups: AppGroups
    /// Accepted audiences: every client id and every group's primary App ID (a web-only
    /// deployment still receives notifications for the app's primary App ID, §10.2).
    let clientIDs: Set<String>
    let teamID: String
    /// The inbox, the audit log and log lines name the subject by its keyed hash only.
    let hasher: SubjectHasher
    let leeway: Duration
    /// How long the inbox keeps a notification's `jti`; an older notification is `stale`.
    let retention: Duration
    let store: NotificationStore
    let logger: Logger
    let now: @Sendable () -> Date
    /// Called after an account-delete was applied (wakes the deletion job in this process).
    let onDeletionRequested: @Sendable () -> Void
    /// Called after an applied notification (its outbox event wakes local dispatchers).
    let eventsWritten: @Sendable () -> Void
    private let outcomes: CounterFamily

    package init(
        verifier: AppleTokenVerifier, clientIDs: Set<String>, groups: AppGroups, teamID: String, hasher: SubjectHasher,
        leeway: Duration,
        retention: Duration = .seconds(30 * 86_400), pool: PostgresPool,
        metrics: MetricsRegistry, logger: Logger, now: @escaping @Sendable () -> Date = Date.init,
        onDeletionRequested: @escaping @Sendable () -> Void = {}, eventsWritten: @escaping @Sendable () -> Void = {}
    ) {
        self.eventsWritten = eventsWritten
        self.verifier = verifier
        self.groups = groups
        self.clientIDs = clientIDs.union(groups.allClientIDs)
        self.teamID = teamID
        self.hasher = hasher
        self.leeway = leeway
        self.retention = retention
        store = NotificationStore(pool: pool)
        self.logger = logger
        self.now = now
        self.onDeletionRequested = onDeletionRequested
        outcomes = metrics.counter(
            "apple_notifications_total",
            help:
                "Server-to-server notifications by event type and outcome (applied, duplicate, stale, unknown_subject, unknown_type, rejected, unavailable).",
            labels: ["type", "outcome"])
    }

    /// What became of a notification; the raw value is the SQL function's answer and the
    /// response's `status`.
    public enum Outcome: String, Sendable, PostgresDecodable {
        case applied, duplicate, stale
        case unknownSubject = "unknown_subject"
        case unknownType = "unknown_type"
    }

    /// Counts and logs a notification refused before it was read (a body that is not JSON).
    public func rejected(code: String, logger: Logger) {
        outcomes.increment("unverified", "rejected")
        logger.warning("notification rejected", [("code", code)])
    }

    /// Verifies and applies one notification, the request's JSON body.
    /// - Throws: `BrokerError` `notification_malformed`, `TokenRejection` (answered 401 by the route),
    ///   `apple_unavailable` when Apple's keys cannot be fetched, or a database outage.
    public func receive(_ body: JSONObjectReader, logger: Logger) throws -> Outcome {
        let notification: AppleNotification
        do {
            notification = try decode(body)
        } catch let error as BrokerError {
            rejected(code: error.code.rawValue, logger: logger)
            throw error
        } catch let rejection as TokenRejection {
            rejected(code: rejection.code.rawValue, logger: logger)
            throw rejection
        }
        // Past the inbox's retention a jti can no longer be recognised as a duplicate: so old
        // a notification is not applied (Apple retries for hours, not weeks).
        if notification.eventTime.timeIntervalSince1970 < now().timeIntervalSince1970 - Double(retention.components.seconds) {
            outcomes.increment(notification.type, Outcome.stale.rawValue)
            return .stale
        }
        let outcome: Outcome
        let group = groups.group(of: notification.audience)
        let subjectHash = hasher.hash(teamID: teamID, sub: notification.sub)
        do {
            outcome = try store.apply(notification, teamID: teamID, group: group, subjectHash: subjectHash)
        } catch let error as PostgresError where error.isUniqueViolation {
            // A concurrent delivery of the same jti committed first; this one rolled back.
            outcome = .duplicate
        } catch let error as PostgresError where error.isUnavailable {
            outcomes.increment(notification.type, "unavailable")
            throw error
        }
        outcomes.increment(notification.type, outcome.rawValue)
        logger.info(
            "notification",
            [
                ("type", notification.type), ("outcome", outcome.rawValue), ("jti", notification.jti),
                ("subject", String(subjectHash.prefix(24))),
            ])
        if outcome == .applied {
            eventsWritten()
            if Self.deletionTypes.contains(notification.type) { onDeletionRequested() }
        }
        return outcome
    }

    static let deletionTypes: Set<String> = ["account-delete", "account-deleted"]

    /// Prunes the inbox: notifications received longer ago than the retention.
    package static func prune(_ pool: PostgresPool, retention: Duration) throws {
        try NotificationStore.prune(pool, retention: retention)
    }

    /// Checks the body's shape and the JWS, and decodes the event.
    func decode(_ body: JSONObjectReader) throws -> AppleNotification {
        guard let payload = try? body.string("payload"), !payload.isEmpty else {
            throw Self.malformed("the body must be {\"payload\": \"<JWS>\"}")
        }
        let claims: AppleClaims
        do {
            claims = try verifier.claims(of: payload, leeway: Double(leeway.components.seconds), now: now().timeIntervalSince1970)
        } catch AppleKeyError.unavailable {
            throw BrokerError.appleUnavailable("Apple's signing keys cannot be fetched")
        }
        return try Self.decode(claims: claims, clientIDs: clientIDs)
    }

    /// The event in a notification's verified claims: issuer, audience, times and `jti`
    /// checked, `events` read whether Apple sent it as a JSON string or an object.
    /// Pure (the fuzz target `fuzz-notification` drives it with arbitrary claims).
    package static func decode(claims: AppleClaims, clientIDs: Set<String>) throws -> AppleNotification {
        try claims.checkIssuer()
        let audience = try claims.audience(accepting: clientIDs.contains)
        let issuedAt = try claims.issuedAt()
        try claims.expiry(required: false, what: "the notification")
        guard let jti = claims[.jti]?.stringValue, !jti.isEmpty, jti.utf8.count <= 256 else {
            throw TokenRejection.malformed("jti is missing")
        }
        // Apple sends `events` as a JSON string; its documentation shows an object. Both are read.
        let event: [String: JSONValue]
        switch claims[.events] {
        case .string(let text)?:
            guard let parsed = try? JSONValue.parseObject(Array(text.utf8)) else {
                throw Self.malformed("events is not a JSON object")
            }
            event = parsed
        case .object(let object)?:
            event = object
        default:
            throw Self.malformed("events is missing")
        }
        guard let type = event["type"]?.stringValue, !type.isEmpty, type.utf8.count <= 64 else {
            throw Self.malformed("events.type is missing")
        }
        guard let sub = event["sub"]?.stringValue, !sub.isEmpty, sub.utf8.count <= 256 else {
            throw Self.malformed("events.sub is missing")
        }
        // event_time is in milliseconds in real payloads and in seconds in Apple's sample.
        var eventTime = Double(issuedAt)
        if let value = event["event_time"] {
            guard let number = value.integerValue.map(Double.init) ?? (value.doubleValue) else {
                throw Self.malformed("events.event_time is not a number")
            }
            eventTime = number > 100_000_000_000 ? number / 1000 : number
        }
        // Email events carry the address and whether it is a relay; bounded like any input.
        let email = event["email"]?.stringValue.flatMap { $0.isEmpty || $0.utf8.count > 320 ? nil : $0 }
        return AppleNotification(
            jti: jti, type: type, sub: sub, eventTime: Date(timeIntervalSince1970: eventTime), audience: audience,
            email: email, isPrivateEmail: event["is_private_email"]?.lenientBoolValue)
    }

    static func malformed(_ detail: String) -> BrokerError { BrokerError(.notificationMalformed, detail) }
}
