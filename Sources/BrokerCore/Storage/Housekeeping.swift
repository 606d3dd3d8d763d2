import PostgresClient

/// Ages out what every component leaves behind, every five minutes: the code-exchange
/// ledger, delivered events, finished web sign-ins and the notification inbox. Each
/// component's store owns its SQL; this only calls them in turn.
package struct Housekeeping: Sendable {
    let pool: PostgresPool
    /// `BROKER_EVENT_RETENTION_SECONDS`: delivered events and deliveries.
    let eventRetentionSeconds: Int
    /// `BROKER_WEBHOOK_DEAD_LETTER_RETENTION_SECONDS`: failed and parked deliveries.
    let deadLetterRetentionSeconds: Int
    /// `BROKER_NOTIFICATION_RETENTION_SECONDS`: the inbox of Apple's notifications.
    let notificationRetentionSeconds: Int

    package init(
        pool: PostgresPool, eventRetentionSeconds: Int, deadLetterRetentionSeconds: Int, notificationRetentionSeconds: Int
    ) {
        self.pool = pool
        self.eventRetentionSeconds = eventRetentionSeconds
        self.deadLetterRetentionSeconds = deadLetterRetentionSeconds
        self.notificationRetentionSeconds = notificationRetentionSeconds
    }

    /// One round; never more to do at once (the worker waits for its interval).
    package func step() throws -> Bool {
        try CodeExchangeStore.prune(pool)
        try TeamTransferStore.pruneStaged(pool)
        try EventRetention.prune(
            pool, retentionSeconds: eventRetentionSeconds, deadLetterRetentionSeconds: deadLetterRetentionSeconds)
        try WebSignInStore.prune(pool)
        try NotificationReceiver.prune(pool, retentionSeconds: notificationRetentionSeconds)
        return false
    }
}
