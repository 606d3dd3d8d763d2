import BrokerCore
import Foundation
import PostgresClient

/// Apple notification figures, the sweep's findings and the audit log, as the operations pages
/// read them: from BrokerCore's stores (see `ConsoleStore`).
extension ConsoleStore {
    typealias NotificationCount = NotificationStore.Count

    func notificationCounts() throws -> [NotificationCount] { try notifications.counts() }

    typealias RecentNotification = NotificationStore.Recent

    func recentNotifications() throws -> [RecentNotification] { try notifications.recent(limit: 50) }

    /// A refresh token the daily sweep found dead while Apple sent no `consent-revoked` or
    /// `account-delete` about its subject (see `RefreshTokenStore.sweepFindings`).
    typealias SweepFinding = RefreshTokenStore.SweepFinding

    /// The newest `limit` findings, subjects as their keyed hash only.
    func sweepFindings(hasher: SubjectHasher, limit: Int = 100) throws -> [SweepFinding] {
        try tokens.sweepFindings(hasher: hasher, limit: limit)
    }

    typealias AuditFilter = AuditLog.Filter
    typealias AuditEntry = AuditLog.Entry

    /// Entries newest first; `limit` bounds an export as well as a page.
    func audit(_ filter: AuditFilter, limit: Int) throws -> [AuditEntry] { try AuditLog.entries(pool, filter, limit: limit) }
}
