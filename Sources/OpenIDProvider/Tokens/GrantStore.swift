import BrokerCrypto
import Foundation
import PostgresClient

/// Grants, codes and tokens (sql/0017). Every secret handed out is a 256-bit random value
/// stored as its hex SHA-256; one statement decides each single use, so two replicas racing
/// on one code or refresh token cannot both win.
package struct GrantStore: Sendable {
    let pool: PostgresPool
    /// The primary App ID of `OIDC_APPLE_CLIENT_ID`'s app group (a grant's `app_id`: Apple's
    /// consent is kept per group, and its events end the grants of that group).
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
        /// The grant's scope, or an access token's own when a refresh asked for less (RFC 6749 §6).
        var scope: String
        let authTime: Date

        var scopes: Set<String> { Set(scope.split(separator: " ").map(String.init)) }
    }

    /// The sign-in a grant rests on: the session it was given in (nil with sessions off), the
    /// `sid` its tokens carry, when Apple authenticated the person, and until when the relying
    /// party's session may live (its Back-Channel Logout needs the grant until then).
    struct Authentication: Sendable {
        var sessionID: UUID?
        var sid: String
        var authTime: Date
        var logoutUntil: Date
    }

    /// Starts a grant and returns its one-time code.
    func createCode(
        clientID: String, userID: UUID, scope: String, redirectURI: String, codeChallenge: String?, nonce: String?,
        authentication: Authentication
    ) throws -> String {
        let code = Self.secret()
        let grantID = UUID()
        try pool.withTransaction { connection in
            try connection.query(
                """
                INSERT INTO oidc_grants (id, client_id, user_id, app_id, sid, scope, auth_time, session_id, logout_until)
                VALUES (\(grantID), \(clientID), \(userID), \(appID), \(authentication.sid), \(scope), \(authentication.authTime),
                        \(authentication.sessionID), \(authentication.logoutUntil))
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
        /// Issued to another client: refused and left unspent (RFC 6749 §4.1.3), so a client
        /// that learnt another's code can neither use nor burn it.
        case otherClient
        case found(Grant, redirectURI: String, codeChallenge: String?, nonce: String?)
    }

    /// Spends a code presented by `clientID`. A second use ends the grant the first one started
    /// (RFC 6749 §4.1.2: revoke the tokens issued on that code). The common case is one
    /// statement: the row lock of the UPDATE decides between two racing uses, and the loser
    /// finds the code spent. The client is part of the match, so another client's code is
    /// never spent.
    func redeem(code: String, clientID: String) throws -> Redemption {
        let hash = SHA256.hexHash(code)
        if let row = try pool.query(
            """
            UPDATE oidc_codes c SET used_at = now() FROM oidc_grants g
            WHERE c.code_hash = \(hash) AND g.id = c.grant_id AND g.client_id = \(clientID) AND c.used_at IS NULL
              AND c.expires_at > now() AND g.ended_at IS NULL
            RETURNING c.redirect_uri, c.code_challenge, c.nonce, g.id, g.client_id, g.user_id, g.sid, g.scope, g.auth_time
            """
        ).first {
            return .found(
                try Self.grant(row), redirectURI: try row.decode(String.self, "redirect_uri"),
                codeChallenge: try row.decode(String?.self, "code_challenge"), nonce: try row.decode(String?.self, "nonce"))
        }
        guard
            let row = try pool.query(
                """
                SELECT c.grant_id, g.client_id, c.used_at IS NOT NULL OR g.ended_at IS NOT NULL AS spent
                FROM oidc_codes c JOIN oidc_grants g ON g.id = c.grant_id WHERE c.code_hash = \(hash)
                """
            ).first
        else { return .unknown }
        guard try row.decode(String.self, "client_id") == clientID else { return .otherClient }
        guard try row.decode(Bool.self, "spent") else { return .expired }
        let grantID = try row.decode(UUID.self, "grant_id")
        try pool.withTransaction { try Self.end(grantID, reason: "code_replayed", $0) }
        return .spent
    }

    /// Issues an access token and, when asked, a refresh token for a grant (one statement).
    /// - Parameter accessScope: the access token's own scope when a refresh asked for less than
    ///   the grant holds (RFC 6749 §6); nil: the grant's. A refresh token always keeps the grant's.
    func issueTokens(grantID: UUID, refresh: Bool, accessScope: String? = nil) throws -> (access: String, refresh: String?) {
        let access = Self.secret()
        let refreshToken = refresh ? Self.secret() : nil
        try pool.query(
            """
            INSERT INTO oidc_tokens (token_hash, grant_id, kind, expires_at, scope)
            SELECT hash, \(grantID)::uuid, kind, now() + make_interval(secs => lifetime), scope
            FROM (VALUES (\(SHA256.hexHash(access))::text, 'access', \(ProviderPolicy.accessTokenLifetimeSeconds)::int,
                          \(accessScope)::text),
                         (\(refreshToken.map { SHA256.hexHash($0) })::text, 'refresh',
                          \(ProviderPolicy.refreshTokenLifetimeSeconds)::int, NULL))
                 AS t (hash, kind, lifetime, scope)
            WHERE hash IS NOT NULL
            """)
        return (access, refreshToken)
    }

    enum RefreshUse: Sendable {
        case unknown
        /// Used before: the grant is now ended (RFC 9700 §4.14.2, refresh token rotation).
        case reused
        case found(Grant)
    }

    /// Spends a refresh token of `clientID`; a reused one ends its grant.
    /// The scopes of the live grant behind an unused refresh token of `clientID`, without using
    /// it: a refresh refused for its request (a wider scope) must not spend the token.
    func scopes(ofUnusedRefreshToken token: String, clientID: String) throws -> Set<String>? {
        try pool.query(
            """
            SELECT g.scope FROM oidc_tokens t JOIN oidc_grants g ON g.id = t.grant_id
            WHERE t.token_hash = \(SHA256.hexHash(token)) AND t.kind = 'refresh' AND g.client_id = \(clientID)
              AND t.used_at IS NULL AND t.expires_at > now() AND g.ended_at IS NULL
            """
        ).first.map { Set(try $0.decode(String.self, "scope").split(separator: " ").map(String.init)) }
    }

    func useRefreshToken(_ token: String, clientID: String) throws -> RefreshUse {
        let hash = SHA256.hexHash(token)
        if let row = try pool.query(
            """
            UPDATE oidc_tokens t SET used_at = now() FROM oidc_grants g
            WHERE t.token_hash = \(hash) AND t.kind = 'refresh' AND g.id = t.grant_id AND g.client_id = \(clientID)
              AND t.used_at IS NULL AND t.expires_at > now() AND g.ended_at IS NULL
            RETURNING g.id, g.client_id, g.user_id, g.sid, g.scope, g.auth_time
            """
        ).first {
            let grant = try Self.grant(row)
            try forgetOldRefreshTokens(of: grant.id)
            return .found(grant)
        }
        guard
            let row = try pool.query(
                """
                SELECT t.grant_id FROM oidc_tokens t JOIN oidc_grants g ON g.id = t.grant_id
                WHERE t.token_hash = \(hash) AND t.kind = 'refresh' AND g.client_id = \(clientID) AND t.used_at IS NOT NULL
                """
            ).first
        else { return .unknown }
        let grantID = try row.decode(UUID.self, "grant_id")
        try pool.withTransaction { try Self.end(grantID, reason: "refresh_token_reused", $0) }
        return .reused
    }

    /// Rotation would leave one used refresh token per use for 90 days (an RP refreshing every
    /// ten minutes: 13,000 rows per grant). Reuse detection needs the recent ones: a stolen
    /// token is replayed soon after the rightful client rotated it. So a grant keeps its
    /// `ProviderPolicy.usedRefreshTokensKept` most recently used ones; an older one presented
    /// again is unknown (`invalid_grant`, the grant goes on).
    private func forgetOldRefreshTokens(of grantID: UUID) throws {
        try pool.query(
            """
            DELETE FROM oidc_tokens WHERE grant_id = \(grantID) AND kind = 'refresh' AND used_at IS NOT NULL
              AND token_hash NOT IN (
                  SELECT token_hash FROM oidc_tokens WHERE grant_id = \(grantID) AND kind = 'refresh' AND used_at IS NOT NULL
                  ORDER BY used_at DESC, token_hash LIMIT \(ProviderPolicy.usedRefreshTokensKept))
            """)
    }

    /// An access token's grant and lifetime, for introspection (RFC 7662): nil when it is not live.
    func introspect(accessToken token: String) throws -> (grant: Grant, expiresAt: Date)? {
        guard token.utf8.count <= 256 else { return nil }
        return try pool.query(
            """
            SELECT g.id, g.client_id, g.user_id, g.sid, coalesce(t.scope, g.scope) AS scope, g.auth_time, t.expires_at
            FROM oidc_tokens t
            JOIN oidc_grants g ON g.id = t.grant_id
            WHERE t.token_hash = \(SHA256.hexHash(token)) AND t.kind = 'access' AND t.expires_at > now() AND g.ended_at IS NULL
            """
        ).first.map { (try Self.grant($0), try $0.decode(Date.self, "expires_at")) }
    }

    /// The live grant behind an access token, or nil (unknown, expired, or its grant ended).
    func grant(accessToken token: String) throws -> Grant? {
        guard token.utf8.count <= 256 else { return nil }
        return try pool.query(
            """
            SELECT g.id, g.client_id, g.user_id, g.sid, coalesce(t.scope, g.scope) AS scope, g.auth_time
            FROM oidc_tokens t JOIN oidc_grants g ON g.id = t.grant_id
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

    /// Deletes what can no longer be used: expired codes (an hour after, so a late replay still
    /// revokes), expired tokens, grants ended a day ago, and live grants without codes and
    /// tokens once their relying party's session can no longer live (`logout_until`: the
    /// provider session's expiry; a day for grants without one). Until then a Back-Channel
    /// Logout can still reach that relying party. Returns the grants deleted.
    @discardableResult
    func prune() throws -> Int {
        try pool.query("DELETE FROM oidc_codes WHERE expires_at < now() - interval '1 hour'")
        try pool.query("DELETE FROM oidc_tokens WHERE expires_at < now()")
        return try pool.query(
            """
            DELETE FROM oidc_grants g WHERE g.ended_at < now() - interval '1 day'
               OR (g.ended_at IS NULL
                   AND coalesce(g.logout_until, g.created_at + interval '1 day') < now()
                   AND NOT EXISTS (SELECT 1 FROM oidc_tokens t WHERE t.grant_id = g.id)
                   AND NOT EXISTS (SELECT 1 FROM oidc_codes c WHERE c.grant_id = g.id))
            RETURNING 1
            """
        ).count
    }

    private static func grant(_ row: PostgresRow) throws -> Grant {
        Grant(
            id: try row.decode(UUID.self, "id"), clientID: try row.decode(String.self, "client_id"),
            userID: try row.decode(UUID.self, "user_id"), sid: try row.decode(String.self, "sid"),
            scope: try row.decode(String.self, "scope"), authTime: try row.decode(Date.self, "auth_time"))
    }
}
