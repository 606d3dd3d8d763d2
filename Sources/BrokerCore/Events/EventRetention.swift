import PostgresClient

/// Ages out what has been delivered: delivered deliveries older than the retention period,
/// then events older than it with no delivery left. Pending and failed deliveries (and so
/// their events) are never pruned.
public enum EventRetention {
    /// - Returns: how many deliveries and events were deleted.
    @discardableResult
    public static func prune(_ pool: PostgresPool, retentionSeconds: Int) throws -> (deliveries: Int, events: Int) {
        let retention = String(retentionSeconds) + " seconds"
        let deliveries = try pool.query(
            "DELETE FROM webhook_deliveries WHERE state = 'delivered' AND delivered_at < now() - \(retention)::interval")
        let events = try pool.query(
            """
            DELETE FROM outbox_events e WHERE e.created_at < now() - \(retention)::interval
              AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id)
            """)
        return (deliveries.affectedRows, events.affectedRows)
    }
}
