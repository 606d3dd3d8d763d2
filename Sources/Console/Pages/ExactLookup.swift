import Foundation
import HTTPServer
import PostgresClient
import StrictJSON

/// Finding a user by one exact value, as the new-deletion page and the lookup page both do:
/// the same form fields (`identify_by`, `value`), the same rules, and one audit row per
/// lookup with a keyed hash of the term, never the term.
struct ExactLookup {
    let store: ConsoleStore
    let termHash: @Sendable (String) -> String

    /// The form's two fields.
    static func fields(_ label: String) -> HTML {
        """
        <label for="identify_by">\(label)</label>
        <select id="identify_by" name="identify_by"><option value="user_id">Broker user id</option>
        <option value="apple_sub">Apple sub</option><option value="email">Exact e-mail address</option></select>
        <label for="value">Value</label><input id="value" name="value" required maxlength="320" autocomplete="off">
        """
    }

    /// The users the request's value names (an e-mail can name several: a lead each), audited.
    func find(_ request: ConsoleRequest, by session: ConsoleSession) throws -> (kind: String, users: [UUID]) {
        let kind = try request.field("identify_by", maximum: 20)
        let value = try request.field("value", maximum: 320)
        let users: [UUID]
        // The value as it is matched (an e-mail address or a UUID in either case is one value), so
        // one term always has one keyed hash in the audit log.
        var term = value
        switch kind {
        case "user_id":
            guard let id = UUID(uuidString: value) else { throw ConsoleRefusal.invalid("A broker user id is a UUID.") }
            term = id.lowercasedString
            users = try store.findUser(userID: id, sub: nil, email: nil)
        case "apple_sub": users = try store.findUser(userID: nil, sub: value, email: nil)
        case "email":
            guard value.contains("@") else { throw ConsoleRefusal.invalid("Give a whole e-mail address.") }
            term = value.lowercased()
            users = try store.findUser(userID: nil, sub: nil, email: term)
        default: throw ConsoleRefusal.invalid("Identify the user by user id, Apple sub or e-mail.")
        }
        try store.pool.withConnection { connection in
            try ConsoleSessionStore.audit(
                connection, actor: session.actor, action: "console.lookup", target: "users",
                detail: ["by": .string(kind), "term_hash": .string(termHash(term)), "matches": .integer(Int64(users.count))])
        }
        return (kind, users)
    }
}
