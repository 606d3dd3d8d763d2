import BrokerCore
import PostgresClient
import StrictJSON

/// Audit entries of the provider's admin acts that no other store writes in its own
/// transaction: refusals (a limited key outside the provider's app) and logout re-drives.
/// Identifiers only (actor `api:<key id>`, target, outcome), never personal data or secrets.
struct AdminAuditStore: Sendable {
    let pool: PostgresPool

    func record(actor: String, action: String, target: String?, outcome: String) throws {
        var detail: [String: JSONValue] = ["outcome": .string(outcome)]
        if let target { detail["target"] = .string(target) }
        try pool.withTransaction { try AuditLog.record($0, actor: actor, action: action, detail: detail) }
    }
}
