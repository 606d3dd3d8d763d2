import Foundation
import PostgresClient
import StrictJSON

/// What became of an administrative act (`audit_log.outcome`, sql/0025).
package enum AuditOutcome: String, Sendable, CaseIterable {
    /// It happened.
    case succeeded
    /// It was not allowed (a role or scope that does not cover it, a sign-in not accepted).
    case refused
    /// It was allowed but did not happen (nothing to act on, an error).
    case failed
}

/// The append-only `audit_log`: who did what to what, and with what outcome, in the
/// transaction that did it. Every administrative act writes one row: the actor (`cli`,
/// `api:<key id>`, `console:<operator>`, `apple`, …), the action (the act attempted, e.g.
/// `api_key.created`), the target (the object acted on: `api_key:<id>`,
/// `webhook_subscription:<uuid>`, `webhook_delivery:<id>`, `console_session`, …) and the
/// outcome. Entries hold identifiers, hashes and reason codes only: never personal data (no
/// e-mail, no name of a user, no client address), never a secret (no key, token, code,
/// password, signing secret, nor a URL that may carry one: a webhook receiver is named by its
/// host). Other modules (the console, the OpenID Provider) write through here too.
package enum AuditLog {
    /// One entry to append.
    package struct Record: Sendable {
        package var actor: String
        package var action: String
        /// What was acted on (`kind:id`); nil where the act has no object of its own.
        package var target: String?
        /// Nil leaves it to the audit_log_defaults trigger (from `detail`, else succeeded).
        package var outcome: AuditOutcome?
        package var subject: String?
        package var deletionID: UUID?
        package var detail: [String: JSONValue]

        package init(
            actor: String, action: String, target: String? = nil, outcome: AuditOutcome? = .succeeded, subject: String? = nil,
            deletionID: UUID? = nil, detail: [String: JSONValue] = [:]
        ) {
            self.actor = actor
            self.action = action
            self.target = target
            self.outcome = outcome
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

    /// Appends `record` on `connection`, inside whatever transaction it is in.
    package static func append(_ record: Record, on connection: PostgresConnection) throws {
        try insert(
            connection, actor: record.actor, action: record.action, target: record.target, outcome: record.outcome,
            subject: record.subject, deletionID: record.deletionID, detail: record.detail)
    }

    /// Appends one entry for an act that succeeded, on `connection` (inside the caller's
    /// transaction). Kept for the callers that predate targets and outcomes.
    package static func record(
        _ connection: PostgresConnection, actor: String, action: String, detail: [String: JSONValue] = [:]
    ) throws {
        // Target and outcome left to the audit_log_defaults trigger (sql/functions/
        // broker_audit_defaults.sql), which reads them from `detail` ("target", "outcome") where
        // the writer put them there.
        try insert(
            connection, actor: actor, action: action, target: nil, outcome: nil, subject: nil, deletionID: nil, detail: detail)
    }

    /// Appends one entry on `connection` (inside the caller's transaction).
    /// - Parameters:
    ///   - target: what was acted on (`kind:id`); nil where the act has no object of its own.
    ///   - subject: the person the act concerns, by id (a user id, `console:<operator>`), for
    ///     the audit log's subject filter.
    package static func record(
        _ connection: PostgresConnection, actor: String, action: String, target: String?,
        outcome: AuditOutcome = .succeeded, subject: String? = nil, deletionID: UUID? = nil,
        detail: [String: JSONValue] = [:]
    ) throws {
        try insert(
            connection, actor: actor, action: action, target: target, outcome: outcome, subject: subject,
            deletionID: deletionID, detail: detail)
    }

    private static func insert(
        _ connection: PostgresConnection, actor: String, action: String, target: String?, outcome: AuditOutcome?,
        subject: String?, deletionID: UUID?, detail: [String: JSONValue]
    ) throws {
        let json = PostgresJSON(text: String(decoding: JSONValue.object(detail).serialized(), as: UTF8.self))
        try connection.query(
            """
            INSERT INTO audit_log (actor, action, target, outcome, subject, deletion_id, detail)
            VALUES (\(actor), \(action), \(target), \(outcome?.rawValue), \(subject), \(deletionID), \(json))
            """)
    }

    /// One entry on a connection of its own (an act that wrote nothing else).
    package static func record(
        _ pool: PostgresPool, actor: String, action: String, target: String?, outcome: AuditOutcome = .succeeded,
        subject: String? = nil, deletionID: UUID? = nil, detail: [String: JSONValue] = [:]
    ) throws {
        try pool.withConnection { connection in
            try record(
                connection, actor: actor, action: action, target: target, outcome: outcome, subject: subject,
                deletionID: deletionID, detail: detail)
        }
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
        /// What was acted on, and what came of it (sql/0025; nil in rows of earlier releases).
        package var target: String?
        package var outcome: String?
    }

    /// Entries newest first; `limit` bounds an export as well as a page.
    package static func entries(_ pool: PostgresPool, _ filter: Filter, limit: Int) throws -> [Entry] {
        try pool.query(
            """
            SELECT id, at, actor, action, subject, deletion_id, detail::text AS detail, target, outcome FROM audit_log
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
                detail: try row.decode(String.self, "detail"), target: try row.decode(String?.self, "target"),
                outcome: try row.decode(String?.self, "outcome"))
        }
    }
}
