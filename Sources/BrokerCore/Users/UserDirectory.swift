import Foundation
import HTTPServer
import PostgresClient

/// Read access to users for app backends: `GET /v1/users/{id}` and its credential state.
struct UserDirectory: Sendable {
    let pool: PostgresPool

    struct Identity: Encodable, Sendable {
        var appleSub: String
        var teamID: String
        var clientID: String
        var email: String?
        var emailVerified: Bool
        var isPrivateEmail: Bool
        var emailForwarding: String
        var realUserStatus: String?
        var consent: String
        var givenName: String?
        var familyName: String?
        var transferred: Bool
        var createdAt: Date
        var lastLoginAt: Date?

        enum CodingKeys: String, CodingKey {
            case appleSub = "apple_sub"
            case teamID = "team_id"
            case clientID = "client_id"
            case email
            case emailVerified = "email_verified"
            case isPrivateEmail = "is_private_email"
            case emailForwarding = "email_forwarding"
            case realUserStatus = "real_user_status"
            case consent
            case givenName = "given_name"
            case familyName = "family_name"
            case transferred
            case createdAt = "created_at"
            case lastLoginAt = "last_login_at"
        }
    }

    struct User: Encodable, Sendable {
        var userID: String
        var status: String
        var createdAt: Date
        var identities: [Identity]

        enum CodingKeys: String, CodingKey {
            case userID = "user_id"
            case status
            case createdAt = "created_at"
            case identities
        }
    }

    /// The user with every identity (never tokens).
    func user(_ id: UUID) throws -> User? {
        guard let row = try pool.query("SELECT status, created_at FROM users WHERE id = \(id)").first else { return nil }
        let identities = try pool.query(
            """
            SELECT sub, team_id, client_id, email, email_verified, is_private_email, email_forwarding, real_user_status,
                   consent, given_name, family_name, transferred_at IS NOT NULL, created_at, last_login_at
            FROM apple_identities WHERE user_id = \(id) ORDER BY created_at
            """
        ).map { row in
            Identity(
                appleSub: try row.decode(String.self, 0), teamID: try row.decode(String.self, 1),
                clientID: try row.decode(String.self, 2), email: try row.decode(String?.self, 3),
                emailVerified: try row.decode(Bool.self, 4), isPrivateEmail: try row.decode(Bool.self, 5),
                emailForwarding: try row.decode(String.self, 6), realUserStatus: try row.decode(String?.self, 7),
                consent: try row.decode(String.self, 8), givenName: try row.decode(String?.self, 9),
                familyName: try row.decode(String?.self, 10), transferred: try row.decode(Bool.self, 11),
                createdAt: try row.decode(Date.self, 12), lastLoginAt: try row.decode(Date?.self, 13))
        }
        return User(
            userID: id.lowercasedString, status: try row.decode(String.self, 0), createdAt: try row.decode(Date.self, 1),
            identities: identities)
    }

    /// The deletion that purged this user, if one did.
    func deletion(ofPurgedUser id: UUID) throws -> UUID? {
        try pool.query("SELECT deletion_id FROM tombstones WHERE user_id = \(id) LIMIT 1").first?.decode(UUID.self, 0)
    }

    /// The server-side twin of `getCredentialState`: `authorized`, `revoked`, `transferred`,
    /// `deleted` or `not_found`. The identity used last decides.
    func credentialState(_ id: UUID) throws -> String {
        if let row = try pool.query(
            """
            SELECT i.consent, i.transferred_at IS NOT NULL, u.status FROM users u
            JOIN apple_identities i ON i.user_id = u.id WHERE u.id = \(id)
            ORDER BY i.transferred_at IS NULL DESC, i.last_login_at DESC NULLS LAST LIMIT 1
            """
        ).first {
            if try row.decode(String.self, 2) == "deleting" { return "deleted" }
            if try row.decode(Bool.self, 1) { return "transferred" }
            return try row.decode(String.self, 0) == "revoked" ? "revoked" : "authorized"
        }
        return try deletion(ofPurgedUser: id) != nil ? "deleted" : "not_found"
    }

    /// Parses a user id path parameter.
    static func userID(_ request: HTTPRequest) throws -> UUID {
        guard let id = UUID(canonicalText: try request.parameter("id")) else {
            throw Problem.badRequest(code: "invalid_user_id", "the user id must be a UUID")
        }
        return id
    }
}
