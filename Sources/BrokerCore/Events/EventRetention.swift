import PostgresClient

/// Ages out what is finished: delivered deliveries older than the retention period
/// (`BROKER_EVENT_RETENTION_SECONDS`), failed deliveries and those parked by a paused
/// subscription older than the dead-letter retention
/// (`BROKER_WEBHOOK_DEAD_LETTER_RETENTION_SECONDS`), then events older than the retention
/// with no delivery left. Deliveries still due are never pruned.
public enum EventRetention {
    /// - Returns: how many deliveries and events were deleted.
    @discardableResult
    public static func prune(
        _ pool: PostgresPool, retention: Duration, deadLetterRetention: Duration
    ) throws -> (deliveries: Int, events: Int) {
        try WebhookDeliveryStore.prune(pool, retention: retention, deadLetterRetention: deadLetterRetention)
    }
}
