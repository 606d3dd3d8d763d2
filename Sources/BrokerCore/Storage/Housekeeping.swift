import PostgresClient

/// Ages out what every component leaves behind, every five minutes: the code-exchange
/// ledger, delivered events, finished web sign-ins, the notification inbox, the console's
/// expired sessions and sign-in links, and dormant users (`DormantUsers`: their deletion). Each component's store owns its SQL; this only calls
/// them in turn (the console's tables are pruned here: BrokerCore does not import Console).
package struct Housekeeping: Sendable {
    let pool: PostgresPool
    /// `BROKER_EVENT_RETENTION_SECONDS`: delivered events and deliveries.
    let eventRetentionSeconds: Int
    /// `BROKER_WEBHOOK_DEAD_LETTER_RETENTION_SECONDS`: failed and parked deliveries.
    let deadLetterRetentionSeconds: Int
    /// `BROKER_NOTIFICATION_RETENTION_SECONDS`: the inbox of Apple's notifications.
    let notificationRetentionSeconds: Int
    /// `BROKER_DORMANT_USER_RETENTION_SECONDS`; nil keeps dormant users.
    let dormantUsers: DormantUsers?

    package init(
        pool: PostgresPool, eventRetentionSeconds: Int, deadLetterRetentionSeconds: Int, notificationRetentionSeconds: Int,
        dormantUserRetention: Duration? = nil
    ) {
        self.pool = pool
        self.eventRetentionSeconds = eventRetentionSeconds
        self.deadLetterRetentionSeconds = deadLetterRetentionSeconds
        self.notificationRetentionSeconds = notificationRetentionSeconds
        dormantUsers = dormantUserRetention.map { DormantUsers(pool: pool, retention: $0) }
    }

    /// Console sessions or links dropped at most per round, so one round's transaction stays
    /// short however many piled up; a full batch asks the worker for another round at once.
    package static let consoleBatch = 1000

    /// One round; true when the console's expired rows or the dormant users filled a batch (more remain).
    package func step() throws -> Bool {
        try CodeExchangeStore.prune(pool)
        try TeamTransferStore.pruneStaged(pool)
        try EventRetention.prune(
            pool, retentionSeconds: eventRetentionSeconds, deadLetterRetentionSeconds: deadLetterRetentionSeconds)
        try WebSignInStore.prune(pool)
        try NotificationReceiver.prune(pool, retentionSeconds: notificationRetentionSeconds)
        let dormant = try dormantUsers?.step() ?? 0
        return try pruneConsole() == Self.consoleBatch || dormant == DormantUsers.batch
    }

    /// Expired console sessions (sql/0018: ended ones are kept until they expire) and expired
    /// sign-in links, used or not: neither signs anybody in any more. Returns the larger count.
    private func pruneConsole() throws -> Int {
        let sessions = try pool.query(
            """
            DELETE FROM console_sessions WHERE id_hash IN (
                SELECT id_hash FROM console_sessions WHERE expires_at < now() ORDER BY expires_at LIMIT \(Self.consoleBatch))
            RETURNING 1
            """
        ).count
        let links = try pool.query(
            """
            DELETE FROM console_links WHERE token_hash IN (
                SELECT token_hash FROM console_links WHERE expires_at < now() ORDER BY expires_at LIMIT \(Self.consoleBatch))
            RETURNING 1
            """
        ).count
        return max(sessions, links)
    }
}
