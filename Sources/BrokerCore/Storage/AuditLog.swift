import PostgresClient
import StrictJSON

/// The append-only `audit_log`: who did what, in the transaction that did it. Entries hold
/// identifiers and hashes only, never personal data or secrets.
package enum AuditLog {
    /// Appends one entry on `connection` (inside the caller's transaction).
    package static func record(
        _ connection: PostgresConnection, actor: String, action: String, detail: [String: JSONValue] = [:]
    ) throws {
        let json = PostgresJSON(text: String(decoding: JSONValue.object(detail).serialized(), as: UTF8.self))
        try connection.query("INSERT INTO audit_log (actor, action, detail) VALUES (\(actor), \(action), \(json))")
    }
}
