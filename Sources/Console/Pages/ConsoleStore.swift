import BrokerCore
import Foundation
import PostgresClient
import StrictJSON

/// What the console's pages read beyond the services' own records: overview figures, the
/// deletion fields the console adds (sql/0018), the identities behind a deletion target
/// (masked before any page sees them) and a deletion's evidence. Read-only but for
/// `annotate`.
struct ConsoleStore: Sendable {
    let pool: PostgresPool
    let teamID: String

    struct Overview {
        var deletionBacklog = 0
        var deletionFailed = 0
        var oldestPendingSeconds: Double = 0
        var webhookPending = 0
        var webhookFailed = 0
        var subscriptions = 0
        var lastNotification: Date?
        var notifications24h = 0
        var activeSessions = 0
    }

    func overview() throws -> Overview {
        let row = try pool.query(
            """
            SELECT
              (SELECT count(*) FROM deletion_requests WHERE state IN ('requested', 'revoking', 'purging')) AS backlog,
              (SELECT count(*) FROM deletion_requests WHERE state = 'failed') AS failed,
              (SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8 FROM deletion_requests
                 WHERE state IN ('requested', 'revoking', 'purging')) AS oldest,
              (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending') AS webhook_pending,
              (SELECT count(*) FROM webhook_deliveries WHERE state = 'failed') AS webhook_failed,
              (SELECT count(*) FROM webhook_subscriptions) AS subscriptions,
              (SELECT max(received_at) FROM apple_notifications) AS last_notification,
              (SELECT count(*) FROM apple_notifications WHERE received_at > now() - interval '1 day') AS notifications,
              (SELECT count(*) FROM console_sessions WHERE ended_at IS NULL AND expires_at > now()) AS sessions
            """
        ).single()
        return Overview(
            deletionBacklog: try row.decode(Int.self, "backlog"), deletionFailed: try row.decode(Int.self, "failed"),
            oldestPendingSeconds: try row.decode(Double.self, "oldest"),
            webhookPending: try row.decode(Int.self, "webhook_pending"),
            webhookFailed: try row.decode(Int.self, "webhook_failed"),
            subscriptions: try row.decode(Int.self, "subscriptions"),
            lastNotification: try row.decode(Date?.self, "last_notification"),
            notifications24h: try row.decode(Int.self, "notifications"), activeSessions: try row.decode(Int.self, "sessions"))
    }

    /// The last notification per client id (`apple_notifications.client_id`, sql/0019) among
    /// `clientIDs`, and since when notifications carry their app at all (rows the previous
    /// release wrote have none, so an app's silence is only counted from then).
    func lastNotifications(of clientIDs: [String]) throws -> (last: [String: Date], attributedSince: Date?) {
        var last: [String: Date] = [:]
        for row in try pool.query(
            """
            SELECT client_id, max(received_at) AS last FROM apple_notifications
            WHERE client_id = ANY (\(PostgresTextArray(clientIDs))::text[]) GROUP BY client_id
            """)
        {
            last[try row.decode(String.self, "client_id")] = try row.decode(Date.self, "last")
        }
        let since = try pool.query("SELECT min(received_at) AS since FROM apple_notifications WHERE client_id IS NOT NULL")
            .single().decode(Date?.self, "since")
        return (last, since)
    }

    /// The console's additions to a deletion request (sql/0018).
    struct Annotation {
        var receivedAt: Date?
        var ticket: String?
        var extendedUntil: Date?
        var extensionReason: String?
    }

    func annotations(_ ids: [UUID]) throws -> [UUID: Annotation] {
        guard !ids.isEmpty else { return [:] }
        var result: [UUID: Annotation] = [:]
        for row in try pool.query(
            """
            SELECT id, received_at, ticket, extended_until, extension_reason FROM deletion_requests
            WHERE id = ANY (\(PostgresTextArray(ids.map(\.lowercasedString)))::uuid[])
            """)
        {
            result[try row.decode(UUID.self, "id")] = Annotation(
                receivedAt: try row.decode(Date?.self, "received_at"), ticket: try row.decode(String?.self, "ticket"),
                extendedUntil: try row.decode(Date?.self, "extended_until"),
                extensionReason: try row.decode(String?.self, "extension_reason"))
        }
        return result
    }

    /// Records the request's receipt and ticket with the deletion the console opened, audited.
    func annotate(_ id: UUID, receivedAt: Date, ticket: String, actor: String) throws {
        try pool.withTransaction { connection in
            try connection.query(
                "UPDATE deletion_requests SET received_at = \(receivedAt), ticket = \(ticket) WHERE id = \(id) AND received_at IS NULL"
            )
            try ConsoleSessionStore.audit(
                connection, actor: actor, action: "console.deletion_requested", target: "deletion:\(id.lowercasedString)",
                deletionID: id,
                detail: ["ticket": .string(ticket), "received_at": .string(RFC3339Date.string(receivedAt))])
        }
    }

    /// Extends the deadline (Art. 12(3) GDPR: by up to two further months, with the reasons),
    /// audited; false when the deletion is done or the date is past the limit.
    func extend(_ id: UUID, until: Date, reason: String, actor: String) throws -> Bool {
        try pool.withTransaction { connection in
            let rows = try connection.query(
                """
                UPDATE deletion_requests SET extended_until = \(until), extension_reason = \(reason)
                WHERE id = \(id) AND state <> 'done'
                  AND \(until)::timestamptz <= COALESCE(received_at, created_at) + interval '90 days'
                  AND \(until)::timestamptz > COALESCE(received_at, created_at) + interval '30 days'
                """)
            guard rows.affectedRows == 1 else { return false }
            try ConsoleSessionStore.audit(
                connection, actor: actor, action: "console.deletion_extended", target: "deletion:\(id.lowercasedString)",
                deletionID: id,
                detail: ["until": .string(RFC3339Date.dayString(until))])
            return true
        }
    }

    /// One Apple identity of a user, for the confirmation page (masked there).
    struct Identity {
        var sub: String
        var clientID: String
        var email: String?
        var emailVerified: Bool
        var isPrivateEmail: Bool
        /// Consent per app group (`apple_grants`; no row: active).
        var consent: String
        var liveTokens: [String]
    }

    /// The user an exact value names: a user id, an Apple `sub` of this team, or an e-mail
    /// address compared after trimming and lower-casing (no pattern, no prefix), verified or
    /// not (an unverified one, from Apple's unsigned `user` field, is flagged on the page).
    func findUser(userID: UUID?, sub: String?, email: String?) throws -> [UUID] {
        if let userID {
            return try pool.query("SELECT id FROM users WHERE id = \(userID)").map { try $0.decode(UUID.self, "id") }
        }
        if let sub {
            return try pool.query("SELECT user_id FROM apple_identities WHERE team_id = \(teamID) AND sub = \(sub)").map {
                try $0.decode(UUID.self, "user_id")
            }
        }
        if let email {
            return try pool.query(
                """
                SELECT DISTINCT user_id FROM apple_identities
                WHERE team_id = \(teamID)
                  AND (lower(email) = \(email.lowercased()) OR lower(unverified_email) = \(email.lowercased())) LIMIT 5
                """
            ).map { try $0.decode(UUID.self, "user_id") }
        }
        return []
    }

    func identities(of userID: UUID) throws -> [Identity] {
        try pool.query(
            """
            SELECT i.sub, i.client_id, COALESCE(i.email, i.unverified_email) AS email,
                   i.email IS NOT NULL AND i.email_verified AS email_verified, i.is_private_email,
                   COALESCE((SELECT string_agg(g.app_id || ': ' || g.consent, ', ' ORDER BY g.app_id) FROM apple_grants g
                             WHERE g.identity_id = i.id), 'active') AS consent,
                   COALESCE((SELECT string_agg(t.client_id, ',' ORDER BY t.client_id) FROM apple_tokens t
                             WHERE t.identity_id = i.id AND t.revoked_at IS NULL), '') AS tokens
            FROM apple_identities i WHERE i.user_id = \(userID) ORDER BY i.created_at
            """
        ).map { row in
            Identity(
                sub: try row.decode(String.self, "sub"), clientID: try row.decode(String.self, "client_id"),
                email: try row.decode(String?.self, "email"), emailVerified: try row.decode(Bool.self, "email_verified"),
                isPrivateEmail: try row.decode(Bool.self, "is_private_email"), consent: try row.decode(String.self, "consent"),
                liveTokens: try row.decode(String.self, "tokens").split(separator: ",").map(String.init))
        }
    }

    /// `user.deleted` deliveries of a deletion's user, per subscription (Art. 19 evidence).
    struct Delivery {
        var subscriptionID: UUID
        var state: String
        var attempts: Int
        var deliveredAt: Date?
    }

    func userDeletedDeliveries(userID: UUID) throws -> [Delivery] {
        try pool.query(
            """
            SELECT d.subscription_id, d.state, d.attempts, d.delivered_at
            FROM webhook_deliveries d JOIN outbox_events e ON e.id = d.event_id
            WHERE e.type = 'user.deleted' AND e.user_id = \(userID) ORDER BY d.id
            """
        ).map { row in
            Delivery(
                subscriptionID: try row.decode(UUID.self, "subscription_id"), state: try row.decode(String.self, "state"),
                attempts: try row.decode(Int.self, "attempts"), deliveredAt: try row.decode(Date?.self, "delivered_at"))
        }
    }

    /// When the purge ran, from the tombstone it left.
    func purgedAt(deletionID: UUID) throws -> Date? {
        try pool.query("SELECT max(deleted_at) AS at FROM tombstones WHERE deletion_id = \(deletionID)").first?.decode(
            Date?.self, "at")
    }
}

/// RFC 3339 times for pages and JSON (UTC, seconds).
enum RFC3339Date {
    static func string(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        return formatter.string(from: date)
    }

    /// `YYYY-MM-DD` as midnight UTC.
    static func day(_ text: String) -> Date? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withFullDate]
        return text.utf8.count == 10 ? formatter.date(from: text) : nil
    }

    static func dayString(_ date: Date) -> String { String(string(date).prefix(10)) }
}
