import BrokerCore
import PostgresClient

/// Keeps the provider's tables bounded: spent codes and tokens, finished grants and sessions, old logout
/// deliveries. BrokerCore's housekeeping (the `sweep` role, every few minutes) runs it through
/// its `ModulePruning` seam.
package struct ProviderHousekeeping: ModulePruning {
    let grants: GrantStore
    let sessions: SessionStore
    let logouts: LogoutDeliveryStore
    let assertions: ClientAssertionStore
    let retention: Duration
    let deadLetterRetention: Duration

    /// - Parameters: the webhook delivery retention settings, which logout deliveries follow.
    package init(pool: PostgresPool, retention: Duration, deadLetterRetention: Duration) {
        // The app id only matters for claims; pruning reads no identity.
        grants = GrantStore(pool: pool, appID: "")
        sessions = SessionStore(pool: pool, appID: "")
        logouts = LogoutDeliveryStore(pool: pool)
        assertions = ClientAssertionStore(pool: pool)
        self.retention = retention
        self.deadLetterRetention = deadLetterRetention
    }

    /// One pass; never more to do at once.
    package func prune() throws -> Bool {
        try grants.prune()
        try sessions.prune()
        try assertions.prune()
        try logouts.prune(retention: retention, deadLetterRetention: deadLetterRetention)
        return false
    }
}
