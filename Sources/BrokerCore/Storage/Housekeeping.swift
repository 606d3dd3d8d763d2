import PostgresClient

/// A module's pruning of its own tables (the console's sessions and sign-in links, the OpenID
/// Provider's codes, tokens, grants and logout deliveries), run in BrokerCore's housekeeping
/// rounds. BrokerCore declares the seam and never imports those modules; the wiring
/// (BrokerAPI) hands their implementations to `Housekeeping`.
package protocol ModulePruning: Sendable {
    /// One round; true when a batch filled and more remain.
    func prune() throws -> Bool
}

/// Ages out what every component leaves behind, every five minutes: the code-exchange
/// ledger, delivered events, finished web sign-ins, the notification inbox, dormant users
/// (`DormantUsers`: their deletion), then each other module's own pruning (`ModulePruning`).
/// Each store owns its SQL; this only calls them in turn.
package struct Housekeeping: Sendable {
    let pool: PostgresPool
    /// `BROKER_EVENT_RETENTION_SECONDS`: delivered events and deliveries.
    let eventRetention: Duration
    /// `BROKER_WEBHOOK_DEAD_LETTER_RETENTION_SECONDS`: failed and parked deliveries.
    let deadLetterRetention: Duration
    /// `BROKER_NOTIFICATION_RETENTION_SECONDS`: the inbox of Apple's notifications.
    let notificationRetention: Duration
    /// `BROKER_DORMANT_USER_RETENTION_SECONDS`; nil keeps dormant users.
    let dormantUsers: DormantUsers?
    /// The other modules' pruning, in order.
    let modules: [any ModulePruning]

    package init(
        pool: PostgresPool, eventRetention: Duration, deadLetterRetention: Duration, notificationRetention: Duration,
        dormantUserRetention: Duration? = nil, modules: [any ModulePruning] = []
    ) {
        self.pool = pool
        self.eventRetention = eventRetention
        self.deadLetterRetention = deadLetterRetention
        self.notificationRetention = notificationRetention
        dormantUsers = dormantUserRetention.map { DormantUsers(pool: pool, retention: $0) }
        self.modules = modules
    }

    /// One round; true when the dormant users or a module's batch filled (more remain: the
    /// worker runs again at once).
    package func step() throws -> Bool {
        try CodeExchangeStore.prune(pool)
        try TeamTransferStore.pruneStaged(pool)
        try EventRetention.prune(pool, retention: eventRetention, deadLetterRetention: deadLetterRetention)
        try WebSignInStore.prune(pool)
        try NotificationReceiver.prune(pool, retention: notificationRetention)
        var more = try dormantUsers?.step() == DormantUsers.batch
        for module in modules where try module.prune() { more = true }
        return more
    }
}
