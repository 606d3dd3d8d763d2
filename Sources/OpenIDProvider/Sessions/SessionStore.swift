import BrokerCrypto
import Foundation
import PostgresClient

/// Sessions at the provider (sql/0023 `oidc_sessions`): one person signed in in one browser,
/// held by the `__Host-abk_oidc` cookie, whose 256-bit secret is stored as its hex SHA-256.
/// Only a verified sign-in at Apple writes a row, so an outsider cannot make one; rows are
/// bounded per browser (one) and per person (`ProviderPolicy.maximumSessionsPerUser`).
package struct SessionStore: Sendable {
    let pool: PostgresPool
    /// The primary App ID of `OIDC_APPLE_CLIENT_ID`'s app group: a `consent-revoked` for it ends these sessions.
    let appID: String

    package init(pool: PostgresPool, appID: String) {
        self.pool = pool
        self.appID = appID
    }

    /// A live session.
    package struct Session: Sendable, Equatable {
        package let id: UUID
        package let userID: UUID
        package let sid: String
        /// When Apple last authenticated the person.
        package let authTime: Date
        package let expiresAt: Date
    }

    /// Whether `secret` can be one of ours (43 base64url characters): anything else is never looked up.
    static func isWellFormed(_ secret: String) -> Bool {
        secret.utf8.count == 43 && Base64URL.decode(secret)?.count == 32
    }

    /// The live session the browser's cookie secret opens, or nil.
    package func find(secret: String) throws -> Session? {
        guard Self.isWellFormed(secret) else { return nil }
        return try pool.query(
            """
            SELECT id, user_id, sid, auth_time, expires_at FROM oidc_sessions
            WHERE browser_hash = \(SHA256.hexHash(secret)) AND ended_at IS NULL AND expires_at > now() AND app_id = \(appID)
            """
        ).first.map(Self.session)
    }

    /// After a verified sign-in at Apple in this browser: renews the browser's live session
    /// when it is the same person's (same sid: their relying parties' sessions stay tied to
    /// it; a later auth_time and expiry), else starts one (ending the browser's session of
    /// another person). The secret is new either way (no fixation). Ends the person's oldest
    /// sessions beyond the bound. Returns the session and the cookie's new secret.
    package func signedIn(userID: UUID, authTime: Date, lifetimeSeconds: Int, previousSecret: String?) throws -> (Session, String)
    {
        let secret = Base64URL.encode(SecureRandom.bytes(32))
        let hash = SHA256.hexHash(secret)
        let previous = previousSecret.flatMap { Self.isWellFormed($0) ? SHA256.hexHash($0) : nil }
        return try pool.withTransaction { connection in
            var session: Session?
            if let previous {
                session = try connection.query(
                    """
                    UPDATE oidc_sessions SET browser_hash = \(hash), auth_time = \(authTime),
                        expires_at = now() + make_interval(secs => \(lifetimeSeconds))
                    WHERE browser_hash = \(previous) AND user_id = \(userID) AND app_id = \(appID)
                      AND ended_at IS NULL AND expires_at > now()
                    RETURNING id, user_id, sid, auth_time, expires_at
                    """
                ).first.map(Self.session)
                if let session {
                    // Its relying parties' sessions may now live as long as it does.
                    try connection.query(
                        """
                        UPDATE oidc_grants SET logout_until = greatest(logout_until, \(session.expiresAt))
                        WHERE session_id = \(session.id) AND ended_at IS NULL
                        """)
                } else {
                    // Another person's, or spent: ended, and its secret released.
                    try connection.query(
                        """
                        UPDATE oidc_sessions SET ended_at = coalesce(ended_at, now()), end_reason = coalesce(end_reason, 'replaced'),
                            browser_hash = 'replaced:' || id::text
                        WHERE browser_hash = \(previous)
                        """)
                }
            }
            if session == nil {
                session = try connection.query(
                    """
                    INSERT INTO oidc_sessions (id, browser_hash, user_id, app_id, sid, auth_time, expires_at)
                    VALUES (\(UUID()), \(hash), \(userID), \(appID), \(Base64URL.encode(SecureRandom.bytes(16))), \(authTime),
                            now() + make_interval(secs => \(lifetimeSeconds)))
                    RETURNING id, user_id, sid, auth_time, expires_at
                    """
                ).first.map(Self.session)
                try connection.query(
                    """
                    UPDATE oidc_sessions SET ended_at = now(), end_reason = 'evicted'
                    WHERE id IN (SELECT id FROM oidc_sessions WHERE user_id = \(userID) AND ended_at IS NULL
                                 ORDER BY created_at DESC, id OFFSET \(ProviderPolicy.maximumSessionsPerUser))
                    """)
            }
            return (session!, secret)
        }
    }

    /// Ends the session `sid` of `userID` (RP-Initiated Logout) with every grant given in it:
    /// their tokens stop working at once, and each relying party with a
    /// `backchannel_logout_uri` gets a Back-Channel Logout delivery, its lane woken at once
    /// (`NOTIFY oidc_logout_due`), as Apple's events do (broker_oidc_end_grants). Works after the session row is pruned:
    /// grants keep their sid. Returns how many grants ended.
    @discardableResult
    func end(sid: String, userID: UUID, reason: String) throws -> Int {
        guard sid.utf8.count <= 64, !sid.utf8.contains(0) else { return 0 }
        return try pool.withTransaction { connection in
            try connection.query(
                """
                UPDATE oidc_sessions SET ended_at = now(), end_reason = \(reason)
                WHERE sid = \(sid) AND user_id = \(userID) AND ended_at IS NULL
                """)
            let ended = try connection.query(
                """
                WITH ended AS (
                    UPDATE oidc_grants SET ended_at = now(), end_reason = \(reason)
                    WHERE sid = \(sid) AND user_id = \(userID) AND ended_at IS NULL
                    RETURNING id, client_id, user_id, sid
                ), tokens AS (
                    DELETE FROM oidc_tokens t USING ended e WHERE t.grant_id = e.id
                ), deliveries AS (
                    INSERT INTO oidc_logout_deliveries (client_id, url, sub, sid, reason)
                    SELECT DISTINCT ON (c.client_id, CASE WHEN c.backchannel_logout_session_required THEN e.sid END)
                           c.client_id, c.backchannel_logout_uri, e.user_id,
                           CASE WHEN c.backchannel_logout_session_required THEN e.sid END, \(reason)
                    FROM ended e JOIN oidc_clients c ON c.client_id = e.client_id
                    WHERE c.backchannel_logout_uri IS NOT NULL
                    RETURNING 1
                )
                SELECT (SELECT count(*) FROM ended) AS ended, (SELECT count(*) FROM deliveries) AS queued
                """
            ).single()
            // Wakes the logout lane in every process at commit, as the trigger does for Apple's events.
            if try ended.decode(Int.self, "queued") > 0 {
                try connection.query("SELECT pg_notify(\(LogoutDeliveryStore.dueChannel), '')")
            }
            return try ended.decode(Int.self, "ended")
        }
    }

    /// Deletes sessions that can no longer be used (expired or ended); their grants keep their sid.
    func prune() throws {
        try pool.query("DELETE FROM oidc_sessions WHERE expires_at < now() OR ended_at IS NOT NULL")
    }

    private static func session(_ row: PostgresRow) throws -> Session {
        Session(
            id: try row.decode(UUID.self, "id"), userID: try row.decode(UUID.self, "user_id"),
            sid: try row.decode(String.self, "sid"), authTime: try row.decode(Date.self, "auth_time"),
            expiresAt: try row.decode(Date.self, "expires_at"))
    }
}
