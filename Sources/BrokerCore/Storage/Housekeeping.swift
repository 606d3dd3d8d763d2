import PostgresClient

/// Ages out what every component leaves behind, every five minutes: the code-exchange
/// ledger, delivered events, finished web sign-ins, the notification inbox and the console's
/// expired sessions and sign-in links. Each component's store owns its SQL; this only calls
/// them in turn (the console's tables are pruned here: BrokerCore does not import Console).
package struct Housekeeping: Sendable {
    let pool: PostgresPool
    /// `BROKER_EVENT_RETENTION_SECONDS`: delivered events and deliveries.
    let eventRetention: Duration
    /// `BROKER_WEBHOOK_DEAD_LETTER_RETENTION_SECONDS`: failed and parked deliveries.
    let deadLetterRetention: Duration
    /// `BROKER_NOTIFICATION_RETENTION_SECONDS`: the inbox of Apple's notifications.
    let notificationRetention: Duration

    package init(pool: PostgresPool, eventRetention: Duration, deadLetterRetention: Duration, notificationRetention: Duration) {
        self.pool = pool
        self.eventRetention = eventRetention
        self.deadLetterRetention = deadLetterRetention
        self.notificationRetention = notificationRetention
    }

    /// Console sessions or links dropped at most per round, so one round's transaction stays
    /// short however many piled up; a full batch asks the worker for another round at once.
    package static let consoleBatch = 1000

    /// One round; true when the console's expired rows filled a batch (more remain).
    package func step() throws -> Bool {
        try CodeExchangeStore.prune(pool)
        try TeamTransferStore.pruneStaged(pool)
        try EventRetention.prune(pool, retention: eventRetention, deadLetterRetention: deadLetterRetention)
        try WebSignInStore.prune(pool)
        try NotificationReceiver.prune(pool, retention: notificationRetention)
        return try pruneConsole() == Self.consoleBatch
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
