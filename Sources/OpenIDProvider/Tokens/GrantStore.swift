import BrokerCrypto
import Foundation
import PostgresClient

/// Grants, codes and tokens (sql/0017). Every secret handed out is a 256-bit random value
/// stored as its hex SHA-256; one statement decides each single use, so two replicas racing
/// on one code or refresh token cannot both win.
package struct GrantStore: Sendable {
    let pool: PostgresPool
    /// The primary App ID of `OIDC_APPLE_CLIENT_ID`'s app group: consent and mail forwarding
    /// are kept per group (sql/0007 `apple_grants`).
    let appID: String

    package init(pool: PostgresPool, appID: String) {
        self.pool = pool
        self.appID = appID
    }

    static func secret() -> String { Base64URL.encode(SecureRandom.bytes(32)) }

    /// A live grant, as a token or code finds it.
    struct Grant: Sendable {
        let id: UUID
        let clientID: String
        let userID: UUID
        let sid: String
        let scope: String
        let authTime: Date

        var scopes: Set<String> { Set(scope.split(separator: " ").map(String.init)) }
    }

    /// Starts a grant and returns its one-time code.
    func createCode(
        clientID: String, userID: UUID, scope: String, redirectURI: String, codeChallenge: String?, nonce: String?
    ) throws -> String {
        let code = Self.secret()
        let grantID = UUID()
        try pool.withTransaction { connection in
            try connection.query(
                """
                INSERT INTO oidc_grants (id, client_id, user_id, app_id, sid, scope, auth_time)
                VALUES (\(grantID), \(clientID), \(userID), \(appID), \(Base64URL.encode(SecureRandom.bytes(16))), \(scope), now())
                """)
            try connection.query(
                """
                INSERT INTO oidc_codes (code_hash, grant_id, redirect_uri, code_challenge, nonce, expires_at)
                VALUES (\(SHA256.hexHash(code)), \(grantID), \(redirectURI), \(codeChallenge), \(nonce),
                        now() + make_interval(secs => \(ProviderPolicy.codeLifetimeSeconds)))
                """)
        }
        return code
    }

    /// What redeeming a code found.
    enum Redemption: Sendable {
        case unknown
        /// Used before (the grant it started is now ended), or expired.
        case spent
        case expired
        case found(Grant, clientID: String, redirectURI: String, codeChallenge: String?, nonce: String?)
    }

    /// Spends a code. A second use ends the grant the first one started (RFC 6749 §4.1.2:
    /// revoke the tokens issued on that code).
    func redeem(code: String) throws -> Redemption {
        let hash = SHA256.hexHash(code)
        return try pool.withTransaction { connection in
            guard
                let row = try connection.query(
                    """
                    SELECT c.used_at IS NOT NULL AS used, c.expires_at <= now() AS expired, c.redirect_uri, c.code_challenge,
                           c.nonce, g.id, g.client_id, g.user_id, g.sid, g.scope, g.auth_time, g.ended_at IS NOT NULL AS ended
                    FROM oidc_codes c JOIN oidc_grants g ON g.id = c.grant_id WHERE c.code_hash = \(hash) FOR UPDATE OF c
                    """
                ).first
            else { return .unknown }
            let grant = try Self.grant(row)
            if try row.decode(Bool.self, "used") || row.decode(Bool.self, "ended") {
                try Self.end(grant.id, reason: "code_replayed", connection)
                return .spent
            }
            if try row.decode(Bool.self, "expired") { return .expired }
            try connection.query("UPDATE oidc_codes SET used_at = now() WHERE code_hash = \(hash)")
            return .found(
                grant, clientID: grant.clientID, redirectURI: try row.decode(String.self, "redirect_uri"),
                codeChallenge: try row.decode(String?.self, "code_challenge"), nonce: try row.decode(String?.self, "nonce"))
        }
    }

    /// Issues an access token and, when asked, a refresh token for a grant.
    func issueTokens(grantID: UUID, refresh: Bool) throws -> (access: String, refresh: String?) {
        let access = Self.secret()
        let refreshToken = refresh ? Self.secret() : nil
        try pool.withTransaction { connection in
            try connection.query(
                """
                INSERT INTO oidc_tokens (token_hash, grant_id, kind, expires_at)
                VALUES (\(SHA256.hexHash(access)), \(grantID), 'access', now() + make_interval(secs => \(ProviderPolicy.accessTokenLifetimeSeconds)))
                """)
            if let refreshToken {
                try connection.query(
                    """
                    INSERT INTO oidc_tokens (token_hash, grant_id, kind, expires_at)
                    VALUES (\(SHA256.hexHash(refreshToken)), \(grantID), 'refresh',
                            now() + make_interval(secs => \(ProviderPolicy.refreshTokenLifetimeSeconds)))
                    """)
            }
        }
        return (access, refreshToken)
    }

    enum RefreshUse: Sendable {
        case unknown
        /// Used before: the grant is now ended (RFC 9700 §4.14.2, refresh token rotation).
        case reused
        case found(Grant)
    }

    /// Spends a refresh token of `clientID`; a reused one ends its grant.
    func useRefreshToken(_ token: String, clientID: String) throws -> RefreshUse {
        let hash = SHA256.hexHash(token)
        return try pool.withTransaction { connection in
            guard
                let row = try connection.query(
                    """
                    SELECT t.used_at IS NOT NULL AS used, t.expires_at <= now() AS expired, g.id, g.client_id, g.user_id,
                           g.sid, g.scope, g.auth_time, g.ended_at IS NOT NULL AS ended
                    FROM oidc_tokens t JOIN oidc_grants g ON g.id = t.grant_id
                    WHERE t.token_hash = \(hash) AND t.kind = 'refresh' FOR UPDATE OF t
                    """
                ).first
            else { return .unknown }
            let grant = try Self.grant(row)
            guard grant.clientID == clientID else { return .unknown }
            if try row.decode(Bool.self, "used") {
                try Self.end(grant.id, reason: "refresh_token_reused", connection)
                return .reused
            }
            if try row.decode(Bool.self, "ended") || row.decode(Bool.self, "expired") { return .unknown }
            try connection.query("UPDATE oidc_tokens SET used_at = now() WHERE token_hash = \(hash)")
            return .found(grant)
        }
    }

    /// The live grant behind an access token, or nil (unknown, expired, or its grant ended).
    func grant(accessToken token: String) throws -> Grant? {
        guard token.utf8.count <= 256 else { return nil }
        return try pool.query(
            """
            SELECT g.id, g.client_id, g.user_id, g.sid, g.scope, g.auth_time FROM oidc_tokens t JOIN oidc_grants g ON g.id = t.grant_id
            WHERE t.token_hash = \(SHA256.hexHash(token)) AND t.kind = 'access' AND t.expires_at > now() AND g.ended_at IS NULL
            """
        ).first.map(Self.grant)
    }

    /// RFC 7009: a refresh token ends its grant (its access tokens too); an access token
    /// ends alone. Tokens of other clients, and unknown ones, are left alone.
    func revoke(_ token: String, clientID: String) throws {
        guard token.utf8.count <= 256 else { return }
        let hash = SHA256.hexHash(token)
        try pool.withTransaction { connection in
            guard
                let row = try connection.query(
                    """
                    SELECT t.kind, g.id FROM oidc_tokens t JOIN oidc_grants g ON g.id = t.grant_id
                    WHERE t.token_hash = \(hash) AND g.client_id = \(clientID)
                    """
                ).first
            else { return }
            if try row.decode(String.self, "kind") == "refresh" {
                try Self.end(try row.decode(UUID.self, "id"), reason: "revoked", connection)
            } else {
                try connection.query("DELETE FROM oidc_tokens WHERE token_hash = \(hash)")
            }
        }
    }

    /// Ends a grant: its codes and tokens stop working at once.
    static func end(_ grantID: UUID, reason: String, _ connection: PostgresConnection) throws {
        try connection.query(
            "UPDATE oidc_grants SET ended_at = coalesce(ended_at, now()), end_reason = coalesce(end_reason, \(reason)) WHERE id = \(grantID)"
        )
        try connection.query("DELETE FROM oidc_tokens WHERE grant_id = \(grantID) AND kind = 'access'")
    }

    /// The claims the user's Apple identity gives, read now (e-mail forwarding changes show at once).
    struct Identity: Sendable {
        var email: String?
        var emailVerified: Bool
        var isPrivateEmail: Bool
        var emailForwarding: String
        var givenName: String?
        var familyName: String?
    }

    func identity(of userID: UUID) throws -> Identity? {
        try pool.query(
            """
            SELECT i.email, i.email_verified, i.is_private_email, coalesce(g.email_forwarding, 'enabled') AS email_forwarding,
                   i.given_name, i.family_name
            FROM apple_identities i LEFT JOIN apple_grants g ON g.identity_id = i.id AND g.app_id = \(appID)
            WHERE i.user_id = \(userID) AND i.transferred_at IS NULL
            ORDER BY i.last_login_at DESC NULLS LAST, i.created_at DESC LIMIT 1
            """
        ).first.map {
            Identity(
                email: try $0.decode(String?.self, "email"), emailVerified: try $0.decode(Bool.self, "email_verified"),
                isPrivateEmail: try $0.decode(Bool.self, "is_private_email"),
                emailForwarding: try $0.decode(String.self, "email_forwarding"),
                givenName: try $0.decode(String?.self, "given_name"), familyName: try $0.decode(String?.self, "family_name"))
        }
    }

    private static func grant(_ row: PostgresRow) throws -> Grant {
        Grant(
            id: try row.decode(UUID.self, "id"), clientID: try row.decode(String.self, "client_id"),
            userID: try row.decode(UUID.self, "user_id"), sid: try row.decode(String.self, "sid"),
            scope: try row.decode(String.self, "scope"), authTime: try row.decode(Date.self, "auth_time"))
    }
}
