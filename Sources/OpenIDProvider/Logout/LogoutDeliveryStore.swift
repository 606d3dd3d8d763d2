import Deliveries
import Foundation
import Observability
import PostgresClient
import StrictJSON

/// Back-Channel Logout deliveries (sql/0017 `oidc_logout_deliveries`, the provider's): the
/// logout lane's rows (`LogoutLane`), claimed oldest due first through the delivery engine's
/// shared queue; listed and re-driven by the admin API. Rows are written by the trigger
/// `broker_oidc_end_grants` on BrokerCore's `outbox_events` (consent.revoked,
/// token.invalidated, user.deletion_requested, user.deleted end the user's grants and
/// sessions), which NOTIFYs `dueChannel`.
package struct LogoutDeliveryStore: Sendable {
    let pool: PostgresPool

    package init(pool: PostgresPool) { self.pool = pool }

    /// The lane's table: the provider owns it, the engine works it.
    static let table = DeliveryTable("oidc_logout_deliveries")
    /// NOTIFYed when deliveries are queued (sql/functions/broker_oidc_end_grants.sql).
    package static let dueChannel = "oidc_logout_due"

    package var queue: DeliveryQueueStore { DeliveryQueueStore(pool: pool, table: Self.table) }

    /// What a claimed logout delivery carries.
    package struct Item: Sendable {
        let clientID: String
        let url: String
        let sub: UUID
        let sid: String?
    }

    /// The oldest due delivery, leased for `lease` (a crashed lane's returns after it).
    func claim(lease: Duration) throws -> ClaimedDelivery<Item>? {
        try queue.claimOldestDue(lease: lease, returning: "client_id, url, sub, sid").map {
            ClaimedDelivery(
                id: try $0.decode(Int64.self, "id"), attempts: try $0.decode(Int.self, "attempts"),
                createdAt: try $0.decode(Date.self, "created_at"),
                item: Item(
                    clientID: try $0.decode(String.self, "client_id"), url: try $0.decode(String.self, "url"),
                    sub: try $0.decode(UUID.self, "sub"), sid: try $0.decode(String?.self, "sid")))
        }
    }

    /// Deliveries, newest first, optionally in one state (the admin API).
    package func list(state: String?, limit: Int) throws -> [JSONValue] {
        try pool.query(
            """
            SELECT id, client_id, reason, state, attempts, last_status, last_error, created_at, delivered_at
            FROM oidc_logout_deliveries WHERE \(state)::text IS NULL OR state = \(state)
            ORDER BY id DESC LIMIT \(limit)
            """
        ).map { row in
            func date(_ name: String) throws -> JSONValue {
                try row.decode(Date?.self, name).map { .string(RFC3339.string(from: $0)) } ?? .null
            }
            return .object([
                "id": .integer(try row.decode(Int64.self, "id")), "client_id": .string(try row.decode(String.self, "client_id")),
                "reason": .string(try row.decode(String.self, "reason")), "state": .string(try row.decode(String.self, "state")),
                "attempts": .integer(Int64(try row.decode(Int.self, "attempts"))),
                "last_status": try row.decode(Int?.self, "last_status").map { .integer(Int64($0)) } ?? .null,
                "last_error": try row.decode(String?.self, "last_error").map(JSONValue.string) ?? .null,
                "created_at": try date("created_at"), "delivered_at": try date("delivered_at"),
            ])
        }
    }

    /// Queues a failed delivery again, now; false when there is no failed delivery with that id.
    package func retry(_ id: Int64) throws -> Bool { try queue.redrive(id) }

    /// Delivered deliveries older than `retention`, failed ones older than `deadLetterRetention`
    /// (the webhook retention settings).
    func prune(retention: Duration, deadLetterRetention: Duration) throws {
        try queue.prune(retention: retention, deadLetterRetention: deadLetterRetention)
    }
}
