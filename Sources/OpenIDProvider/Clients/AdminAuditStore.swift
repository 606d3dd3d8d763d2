import BrokerCore
import PostgresClient
import StrictJSON

/// Audit entries of the provider's admin acts that no other store writes in its own
/// transaction: refusals (a limited key outside the provider's app), logout re-drives and deletions
/// or re-drives that found nothing (outcome `not_found`, a failed act to the audit trigger).
/// Identifiers only (actor `api:<key id>`, target, outcome), never personal data or secrets.
struct AdminAuditStore: Sendable {
    let pool: PostgresPool

    func record(actor: String, action: String, target: String?, outcome: String) throws {
        var detail: [String: JSONValue] = ["outcome": .string(outcome)]
        // A path's id is the caller's text: bounded (ids we issue are shorter).
        if let target { detail["target"] = .string(String(target.prefix(64))) }
        try pool.withTransaction { try AuditLog.record($0, actor: actor, action: action, detail: detail) }
    }
}
