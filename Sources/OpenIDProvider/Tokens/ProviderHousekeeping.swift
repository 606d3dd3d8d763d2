import PostgresClient

/// Keeps the provider's tables bounded (the `sweep` role runs it every few minutes): spent
/// codes and tokens, finished grants and sessions, old logout deliveries.
package struct ProviderHousekeeping: Sendable {
    let grants: GrantStore
    let sessions: SessionStore
    let logouts: LogoutDeliveryStore
    let assertions: ClientAssertionStore
    let retentionSeconds: Int
    let deadLetterRetentionSeconds: Int

    /// - Parameters: the webhook delivery retention settings, which logout deliveries follow.
    package init(pool: PostgresPool, retentionSeconds: Int, deadLetterRetentionSeconds: Int) {
        // The app id only matters for claims; pruning reads no identity.
        grants = GrantStore(pool: pool, appID: "")
        sessions = SessionStore(pool: pool, appID: "")
        logouts = LogoutDeliveryStore(pool: pool)
        assertions = ClientAssertionStore(pool: pool)
        self.retentionSeconds = retentionSeconds
        self.deadLetterRetentionSeconds = deadLetterRetentionSeconds
    }

    /// One pass; never more to do at once (a worker step).
    package func step() throws -> Bool {
        try grants.prune()
        try sessions.prune()
        try assertions.prune()
        try logouts.prune(retentionSeconds: retentionSeconds, deadLetterRetentionSeconds: deadLetterRetentionSeconds)
        return false
    }
}
