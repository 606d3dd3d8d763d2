import Foundation
import Observability
import PostgresClient
import StrictJSON

/// Back-Channel Logout deliveries (sql/0017 `oidc_logout_deliveries`): claimed with a lease
/// and `SKIP LOCKED` by dispatcher lanes, as webhook deliveries are; listed and re-driven
/// by the admin API.
package struct LogoutDeliveryStore: Sendable {
    let pool: PostgresPool

    package init(pool: PostgresPool) { self.pool = pool }

    struct Claimed: Sendable {
        let id: Int64
        let clientID: String
        let url: String
        let sub: UUID
        let sid: String?
        let attempts: Int
        let createdAt: Date
    }

    /// The next due delivery, leased for `lease` (a crashed lane's returns after it).
    func claim(lease: Duration) throws -> Claimed? {
        try pool.query(
            """
            UPDATE oidc_logout_deliveries SET attempts = attempts + 1,
                next_attempt_at = now() + \(lease)::interval
            WHERE id = (SELECT id FROM oidc_logout_deliveries WHERE state = 'pending' AND next_attempt_at <= now()
                        ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED)
            RETURNING id, client_id, url, sub, sid, attempts, created_at
            """
        ).first.map {
            Claimed(
                id: try $0.decode(Int64.self, "id"), clientID: try $0.decode(String.self, "client_id"),
                url: try $0.decode(String.self, "url"), sub: try $0.decode(UUID.self, "sub"),
                sid: try $0.decode(String?.self, "sid"), attempts: try $0.decode(Int.self, "attempts"),
                createdAt: try $0.decode(Date.self, "created_at"))
        }
    }

    func recordDelivered(_ id: Int64, status: Int) throws {
        try pool.query(
            """
            UPDATE oidc_logout_deliveries SET state = 'delivered', delivered_at = now(), last_status = \(status), last_error = NULL
            WHERE id = \(id)
            """)
    }

    func recordFailure(_ id: Int64, expired: Bool, delayMilliseconds: Int, status: Int?, error: String) throws {
        try pool.query(
            """
            UPDATE oidc_logout_deliveries SET state = CASE WHEN \(expired) THEN 'failed' ELSE 'pending' END,
                next_attempt_at = now() + make_interval(secs => \(Double(delayMilliseconds) / 1000)),
                last_status = \(status), last_error = \(error)
            WHERE id = \(id)
            """)
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
    package func retry(_ id: Int64) throws -> Bool {
        !(try pool.query(
            """
            UPDATE oidc_logout_deliveries SET state = 'pending', next_attempt_at = now(), attempts = 0, created_at = now()
            WHERE id = \(id) AND state = 'failed' RETURNING 1
            """
        ).isEmpty)
    }

    /// Delivered deliveries older than `retention`, failed ones older than `deadLetterRetention`
    /// (the webhook retention settings).
    func prune(retention: Duration, deadLetterRetention: Duration) throws {
        try pool.query(
            """
            DELETE FROM oidc_logout_deliveries
            WHERE (state = 'delivered' AND delivered_at < now() - \(retention)::interval)
               OR (state = 'failed' AND created_at < now() - \(deadLetterRetention)::interval)
            """)
    }

    /// Waiting and failed deliveries, for `/metrics`.
    func backlog() throws -> (pending: Double, failed: Double) {
        let row = try pool.query(
            """
            SELECT count(*) FILTER (WHERE state = 'pending') AS pending, count(*) FILTER (WHERE state = 'failed') AS failed
            FROM oidc_logout_deliveries
            """
        ).single()
        return (Double(try row.decode(Int.self, "pending")), Double(try row.decode(Int.self, "failed")))
    }
}
