import Foundation
import PostgresClient

/// Users and their Apple identities as the console asks for them: its exact lookup, its
/// deletion confirmation and its audited e-mail reveal. `apple_identities`, `apple_grants` and
/// `apple_tokens` are BrokerCore's: the console reads them only through here (and the OpenID
/// Provider through `UserDirectory.profile`).
package struct UserLookupStore: Sendable {
    let pool: PostgresPool
    /// Only this team's identities.
    let teamID: String

    package init(pool: PostgresPool, teamID: String) {
        self.pool = pool
        self.teamID = teamID
    }

    /// The user an exact value names: a user id, an Apple `sub` of this team, or an e-mail
    /// address compared after trimming and lower-casing (no pattern, no prefix), verified or
    /// not (an unverified one, from Apple's unsigned `user` field, is flagged where shown).
    /// At most five users.
    package func findUser(userID: UUID?, sub: String?, email: String?) throws -> [UUID] {
        if let userID {
            return try pool.query("SELECT id FROM users WHERE id = \(userID)").map { try $0.decode(UUID.self, "id") }
        }
        if let sub {
            return try pool.query("SELECT user_id FROM apple_identities WHERE team_id = \(teamID) AND sub = \(sub)").map {
                try $0.decode(UUID.self, "user_id")
            }
        }
        if let email {
            return try pool.query(
                """
                SELECT DISTINCT user_id FROM apple_identities
                WHERE team_id = \(teamID)
                  AND (lower(email) = \(email.lowercased()) OR lower(unverified_email) = \(email.lowercased())) LIMIT 5
                """
            ).map { try $0.decode(UUID.self, "user_id") }
        }
        return []
    }

    /// One Apple identity of a user, for a confirmation page (masked there).
    package struct IdentitySummary: Sendable {
        package var sub: String
        package var clientID: String
        package var email: String?
        package var emailVerified: Bool
        package var isPrivateEmail: Bool
        /// Consent per app group (`apple_grants`; no row: active).
        package var consent: String
        package var liveTokens: [String]
    }

    package func identities(of userID: UUID) throws -> [IdentitySummary] {
        try pool.query(
            """
            SELECT i.sub, i.client_id, COALESCE(i.email, i.unverified_email) AS email,
                   i.email IS NOT NULL AND i.email_verified AS email_verified, i.is_private_email,
                   COALESCE((SELECT string_agg(g.app_id || ': ' || g.consent, ', ' ORDER BY g.app_id) FROM apple_grants g
                             WHERE g.identity_id = i.id), 'active') AS consent,
                   COALESCE((SELECT string_agg(t.client_id, ',' ORDER BY t.client_id) FROM apple_tokens t
                             WHERE t.identity_id = i.id AND t.revoked_at IS NULL), '') AS tokens
            FROM apple_identities i WHERE i.user_id = \(userID) ORDER BY i.created_at
            """
        ).map { row in
            IdentitySummary(
                sub: try row.decode(String.self, "sub"), clientID: try row.decode(String.self, "client_id"),
                email: try row.decode(String?.self, "email"), emailVerified: try row.decode(Bool.self, "email_verified"),
                isPrivateEmail: try row.decode(Bool.self, "is_private_email"), consent: try row.decode(String.self, "consent"),
                liveTokens: try row.decode(String.self, "tokens").split(separator: ",").map(String.init))
        }
    }

    /// The identity's e-mail (verified, else Apple's unsigned one) for an audited reveal; nil when none.
    package func email(userID: UUID, sub: String) throws -> String? {
        try pool.query(
            """
            SELECT COALESCE(email, unverified_email) AS email FROM apple_identities
            WHERE user_id = \(userID) AND team_id = \(teamID) AND sub = \(sub)
            """
        ).first?.decode(String?.self, "email")
    }
}
