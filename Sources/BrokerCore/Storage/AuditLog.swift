import Foundation
import PostgresClient
import StrictJSON

/// The append-only `audit_log`, BrokerCore's: who did what, in the transaction that did it.
/// Entries hold identifiers and hashes only, never personal data or secrets. Other modules
/// (the console's `console.*` rows) append and read through here, never by their own SQL.
package enum AuditLog {
    /// One entry to append.
    package struct Record: Sendable {
        package var actor: String
        package var action: String
        package var subject: String?
        package var deletionID: UUID?
        package var detail: [String: JSONValue]

        package init(
            actor: String, action: String, subject: String? = nil, deletionID: UUID? = nil, detail: [String: JSONValue] = [:]
        ) {
            self.actor = actor
            self.action = action
            self.subject = subject
            self.deletionID = deletionID
            self.detail = detail
        }

        /// The same entry about a deletion request.
        func about(deletion id: UUID) -> Record {
            var record = self
            record.deletionID = id
            return record
        }
    }

    /// Appends one entry on `connection` (inside the caller's transaction).
    package static func record(
        _ connection: PostgresConnection, actor: String, action: String, detail: [String: JSONValue] = [:]
    ) throws {
        try append(Record(actor: actor, action: action, detail: detail), on: connection)
    }

    /// Appends `record` on `connection`, inside whatever transaction it is in.
    package static func append(_ record: Record, on connection: PostgresConnection) throws {
        let json = PostgresJSON(text: String(decoding: JSONValue.object(record.detail).serialized(), as: UTF8.self))
        try connection.query(
            """
            INSERT INTO audit_log (actor, action, subject, deletion_id, detail)
            VALUES (\(record.actor), \(record.action), \(record.subject), \(record.deletionID), \(json))
            """)
    }

    /// Which entries to read; nil members match anything.
    package struct Filter: Sendable {
        package var actor: String?
        package var action: String?
        package var subject: String?
        package var deletionID: UUID?
        package var from: Date?
        package var to: Date?

        package init(
            actor: String? = nil, action: String? = nil, subject: String? = nil, deletionID: UUID? = nil, from: Date? = nil,
            to: Date? = nil
        ) {
            self.actor = actor
            self.action = action
            self.subject = subject
            self.deletionID = deletionID
            self.from = from
            self.to = to
        }
    }

    package struct Entry: Sendable {
        package var id: Int64
        package var at: Date
        package var actor: String
        package var action: String
        package var subject: String?
        package var deletionID: UUID?
        /// The detail as its JSON text.
        package var detail: String
    }

    /// Entries newest first; `limit` bounds an export as well as a page.
    package static func entries(_ pool: PostgresPool, _ filter: Filter, limit: Int) throws -> [Entry] {
        try pool.query(
            """
            SELECT id, at, actor, action, subject, deletion_id, detail::text AS detail FROM audit_log
            WHERE (\(filter.actor)::text IS NULL OR actor = \(filter.actor)::text)
              AND (\(filter.action)::text IS NULL OR action = \(filter.action)::text)
              AND (\(filter.subject)::text IS NULL OR subject = \(filter.subject)::text)
              AND (\(filter.deletionID)::uuid IS NULL OR deletion_id = \(filter.deletionID)::uuid)
              AND (\(filter.from)::timestamptz IS NULL OR at >= \(filter.from)::timestamptz)
              AND (\(filter.to)::timestamptz IS NULL OR at < \(filter.to)::timestamptz)
            ORDER BY id DESC LIMIT \(limit)
            """
        ).map { row in
            Entry(
                id: try row.decode(Int64.self, "id"), at: try row.decode(Date.self, "at"),
                actor: try row.decode(String.self, "actor"), action: try row.decode(String.self, "action"),
                subject: try row.decode(String?.self, "subject"), deletionID: try row.decode(UUID?.self, "deletion_id"),
                detail: try row.decode(String.self, "detail"))
        }
    }
}
