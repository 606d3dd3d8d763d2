import BrokerCrypto
import Foundation
import Observability
import PostgresClient
import StrictJSON

/// The pull feed `GET /v1/events?after=CURSOR&limit=N`: outbox events in a stable order
/// with an opaque cursor.
///
/// Order is (writing transaction id, event id), and only events of transactions older than
/// every transaction still in flight are returned. A transaction that started early but
/// commits late therefore appears before the cursor passes it, never behind it: a consumer
/// paging with the cursor misses nothing (DESIGN.md §3's outbox pitfall).
///
/// Another module reacts to `outbox_events` in the writer's transaction: the OpenID Provider's
/// trigger `broker_oidc_end_grants` ends the user's OIDC grants and sessions and queues
/// Back-Channel Logout deliveries when `consent.revoked`, `token.invalidated`,
/// `user.deletion_requested` or `user.deleted` is written.
package struct EventFeed: Sendable {
    let pool: PostgresPool

    package init(pool: PostgresPool) { self.pool = pool }

    package struct Cursor: Equatable, Sendable {
        var transaction: UInt64
        var event: Int64

        package static let start = Cursor(transaction: 0, event: 0)

        package var text: String { Base64URL.encode("\(transaction):\(event)") }

        init(transaction: UInt64, event: Int64) {
            self.transaction = transaction
            self.event = event
        }

        package init?(text: String) {
            guard let bytes = Base64URL.decode(text), let plain = String(validating: bytes, as: UTF8.self) else { return nil }
            let parts = plain.split(separator: ":")
            guard parts.count == 2, let transaction = UInt64(parts[0]), let event = Int64(parts[1]) else { return nil }
            self.init(transaction: transaction, event: event)
        }
    }

    /// - Parameters:
    ///   - reach: a limited key's client ids: only events of those apps (`broker_event_in_apps_v2`).
    ///   - groups: the app groups (primary App IDs) of those client ids, which grant events name.
    package func page(
        after cursor: Cursor, limit: Int, reach: PostgresTextArray? = nil, groups: PostgresTextArray? = nil
    ) throws -> (
        events: [JSONValue], next: Cursor
    ) {
        // ORDER BY qualifies its columns: a bare `txid` would name the *output* column
        // `txid::text` and sort "1000" before "995", which once skipped and repeated events.
        let rows = try pool.query(
            """
            SELECT e.id, e.type, e.user_id, e.payload::text AS payload, e.created_at, e.txid::text AS transaction FROM outbox_events e
            WHERE e.txid >= \(String(cursor.transaction))::xid8
              AND (e.txid > \(String(cursor.transaction))::xid8 OR e.id > \(cursor.event))
              AND e.txid < pg_snapshot_xmin(pg_current_snapshot())
              AND (\(reach)::text[] IS NULL OR broker_event_in_apps_v2(e.user_id, e.type, e.payload, \(reach)::text[], \(groups)::text[]))
            ORDER BY e.txid, e.id LIMIT \(limit)
            """)
        var next = cursor
        var events: [JSONValue] = []
        for row in rows {
            let id = try row.decode(Int64.self, "id")
            next = Cursor(transaction: UInt64(try row.decode(String.self, "transaction")) ?? 0, event: id)
            events.append(
                .object([
                    "id": .string("evt_\(id)"), "type": .string(try row.decode(String.self, "type")),
                    "user_id": try row.decode(UUID?.self, "user_id").map { .string($0.lowercasedString) } ?? .null,
                    "data": try JSONValue.parse(Array(try row.decode(String.self, "payload").utf8)),
                    "created_at": .string(RFC3339.string(from: try row.decode(Date.self, "created_at"))),
                    "cursor": .string(next.text),
                ]))
        }
        return (events, next)
    }
}
