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
}
