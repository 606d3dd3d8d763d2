import BrokerCore
import Deliveries
import Foundation
import PostgresClient
import StrictJSON

/// What the console's pages read beyond the services' own records, each from the module that
/// owns it (docs/development.md, "Who owns which table"): BrokerCore's stores for the broker's
/// tables (deletions and their follow-ups, notifications, identities, the sweep, webhooks, the
/// audit log), the console's own store for its sessions. No SQL here: the console's tables are
/// `console_*`, and its deletion actions go through BrokerCore's `DeletionService`, which holds
/// the deadline rule (`DeletionDeadline`).
struct ConsoleStore: Sendable {
    let deletions: DeletionService
    let sessions: ConsoleSessionStore
    let users: UserLookupStore
    let notifications: NotificationStore
    let tokens: RefreshTokenStore
    let webhooks: WebhookSubscriptionStore
    /// The delivery lanes' queues, for the overview's backlog charts; the provider's is handed
    /// over by the wiring (nil: not charted).
    let webhookQueue: DeliveryQueueStore?
    let logoutQueue: DeliveryQueueStore?
    /// For the audit log (BrokerCore's `AuditLog`) and the pages' audited reads.
    var pool: PostgresPool { deletions.store.pool }

    init(
        deletions: DeletionService, sessions: ConsoleSessionStore, webhooks: WebhookSubscriptionStore, teamID: String,
        logoutQueue: DeliveryQueueStore? = nil
    ) {
        self.deletions = deletions
        self.sessions = sessions
        self.webhooks = webhooks
        let pool = deletions.store.pool
        webhookQueue = WebhookDeliveryStore(pool: pool).queue
        self.logoutQueue = logoutQueue
        users = UserLookupStore(pool: pool, teamID: teamID)
        notifications = NotificationStore(pool: pool)
        tokens = RefreshTokenStore(pool: pool, teamID: teamID)
    }

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
        let deletion = try deletions.store.figures()
        let webhook = try webhooks.figures()
        let notification = try notifications.figures()
        return Overview(
            deletionBacklog: deletion.backlog, deletionFailed: deletion.failed,
            oldestPendingSeconds: deletion.oldestPendingSeconds,
            webhookPending: webhook.pending, webhookFailed: webhook.failed, subscriptions: webhook.subscriptions,
            lastNotification: notification.last, notifications24h: notification.lastDay,
            activeSessions: try sessions.activeSessions())
    }

    /// The last notification per client id among `clientIDs`, and since when notifications
    /// carry their app at all (see `NotificationStore.lastNotifications`).
    func lastNotifications(of clientIDs: [String]) throws -> (last: [String: Date], attributedSince: Date?) {
        try notifications.lastNotifications(of: clientIDs)
    }

    /// The console's additions to a deletion request (sql/0018).
    typealias Annotation = DeletionStore.Annotation

    func annotations(_ ids: [UUID]) throws -> [UUID: Annotation] { try deletions.store.annotations(ids) }

    /// Records the request's receipt and ticket with the deletion the console opened, audited.
    func annotate(_ id: UUID, receivedAt: Date, ticket: String, actor: String) throws {
        try deletions.annotate(
            id, receivedAt: receivedAt, ticket: ticket,
            audit: AuditLog.Record(
                actor: actor, action: "console.deletion_requested", target: "deletion:\(id.lowercasedString)",
                detail: ["ticket": .string(ticket), "received_at": .string(RFC3339Date.string(receivedAt))]))
    }

    /// Extends the deadline (Art. 12(3) GDPR, `DeletionDeadline`), audited; false when the
    /// deletion is done or the date is outside what the rule allows.
    func extend(_ id: UUID, until: Date, reason: String, actor: String) throws -> Bool {
        try deletions.extendDeadline(
            id, until: until, reason: reason,
            audit: AuditLog.Record(
                actor: actor, action: "console.deletion_extended", target: "deletion:\(id.lowercasedString)",
                detail: ["until": .string(RFC3339Date.dayString(until))]))
    }

    /// One Apple identity of a user, for the confirmation page (masked there).
    typealias Identity = UserLookupStore.IdentitySummary

    /// The user an exact value names (see `UserLookupStore.findUser`).
    func findUser(userID: UUID?, sub: String?, email: String?) throws -> [UUID] {
        try users.findUser(userID: userID, sub: sub, email: email)
    }

    func identities(of userID: UUID) throws -> [Identity] { try users.identities(of: userID) }

    /// `user.deleted` deliveries of a deletion's user, per subscription (Art. 19 evidence).
    typealias Delivery = WebhookSubscriptionStore.UserDeletedDelivery

    func userDeletedDeliveries(userID: UUID) throws -> [Delivery] { try webhooks.userDeletedDeliveries(userID: userID) }

    /// When the purge ran, from the tombstone it left.
    func purgedAt(deletionID: UUID) throws -> Date? { try deletions.store.purgedAt(deletionID: deletionID) }
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
