import PostgresClient

/// Ages out what has been delivered: delivered deliveries older than the retention period,
/// then events older than it with no delivery left. Pending and failed deliveries (and so
/// their events) are never pruned.
public enum EventRetention {
    /// - Returns: how many deliveries and events were deleted.
    @discardableResult
    public static func prune(_ pool: PostgresPool, retentionSeconds: Int) throws -> (deliveries: Int, events: Int) {
        try WebhookDeliveryStore.prune(pool, retentionSeconds: retentionSeconds)
    }
}
