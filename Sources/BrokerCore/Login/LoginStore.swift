import AppleID
import BrokerCrypto
import Foundation
import PostgresClient

/// The database side of a login: one call of `broker_login` (sql/0002_login.sql, as replaced
/// since), which upserts the user and identity, stores the refresh token and writes the
/// outbox events in one transaction; a repeat login that changes nothing takes the fast path
/// (`unchangedRepeatLogin`) instead.
/// What `broker_login` answered (its `r_outcome`): `deletion_pending` when the user's
/// deletion was requested, and nothing was written.
enum LoginOutcome: String, Sendable, CaseIterable, PostgresDecodable {
    case ok
    case deletionPending = "deletion_pending"
}

struct LoginStore: Sendable {
    let pool: PostgresPool
    let teamID: String
    /// Repeat logins changing nothing rewrite last_login_at only when older than this.
    let lastLoginResolution: Duration
    /// A login re-activates consent for its client id's group only.
    let groups: AppGroups
    /// Names the sub in the tombstone check without the sub itself.
    let hasher: SubjectHasher

    struct Record: Sendable {
        var outcome: LoginOutcome
        var userID: UUID
        var isNewUser: Bool
        var email: String?
        var emailVerified: Bool
        var isPrivateEmail: Bool
        var realUserStatus: RealUserStatus?
        var refreshTokenStored: Bool
        /// The e-mail of Apple's unsigned `user` field at the first authorization, when the
        /// verified token had another (or none).
        var unverifiedEmail: String?
        /// Whether broker_login ran (and so may have written outbox events).
        var wroteThrough = true
    }

    func login(
        _ identity: AppleIdentity, user: AppleUserField?, sealedRefreshToken: (keyID: String, sealed: [UInt8])?,
        validationJitterSeconds: Int
    ) throws -> Record {
        let record = try upsertLogin(
            identity, user: user, sealedRefreshToken: sealedRefreshToken, validationJitterSeconds: validationJitterSeconds)
        if let orgID = identity.orgID, record.outcome == .ok {
            // broker_login (released) takes no org_id: a managed account's is written beside it,
            // only when it changed.
            try pool.query(
                """
                UPDATE apple_identities SET org_id = \(orgID)
                WHERE team_id = \(teamID) AND sub = \(identity.sub) AND org_id IS DISTINCT FROM \(orgID)
                """)
        }
        return record
    }

    private func upsertLogin(
        _ identity: AppleIdentity, user: AppleUserField?, sealedRefreshToken: (keyID: String, sealed: [UInt8])?,
        validationJitterSeconds: Int
    ) throws -> Record {
        if sealedRefreshToken == nil, let record = try unchangedRepeatLogin(identity, user: user) { return record }
        guard let transferSub = identity.transferSub else {
            guard user?.name != nil || user?.email != nil else {
                return try upsert(
                    pool, identity, user: user, sealedRefreshToken: sealedRefreshToken,
                    validationJitterSeconds: validationJitterSeconds)
            }
            return try pool.withTransaction { connection in
                try keepReauthorizationUserField(connection, identity, user: user)
                return try upsert(
                    connection, identity, user: user, sealedRefreshToken: sealedRefreshToken,
                    validationJitterSeconds: validationJitterSeconds)
            }
        }
        // A token carrying transfer_sub (the 60 days after a team transfer): the login joins the
        // user of the old sub and, in the same transaction, retires the old team's identity and
        // refresh tokens as `transfer import` does.
        return try pool.withTransaction { connection in
            let linked = try joinStagedTransfer(connection, identity, user: user, transferSub: transferSub)
            var record = try upsert(
                connection, identity, user: user, sealedRefreshToken: sealedRefreshToken,
                validationJitterSeconds: validationJitterSeconds)
            guard record.outcome == .ok else { return record }
            if linked { record.wroteThrough = true }
            try TeamTransferStore.retireOldTeam(connection, userID: record.userID, teamID: teamID, transferSub: transferSub)
            return record
        }
    }

    /// A first login with a `transfer_sub` that `transfer import` staged but has not linked yet
    /// (the recipient may run a database of its own, without the sender's identities): the
    /// identity is created for the sender's user id, as the import would, so broker_login then
    /// takes it as a repeat login and no second user appears. True when it linked one.
    private func joinStagedTransfer(
        _ connection: some PostgresQuerying, _ identity: AppleIdentity, user: AppleUserField?, transferSub: String
    ) throws -> Bool {
        guard
            try connection.query("SELECT 1 FROM apple_identities WHERE team_id = \(teamID) AND sub = \(identity.sub)").isEmpty,
            let userID = try TeamTransferStore.stagedUser(connection, teamID: teamID, transferSub: transferSub),
            try connection.query("SELECT 1 FROM tombstones WHERE user_id = \(userID)").isEmpty
        else { return false }
        try connection.query("INSERT INTO users (id) VALUES (\(userID)) ON CONFLICT (id) DO NOTHING")
        let inserted = try connection.query(
            """
            INSERT INTO apple_identities (
                id, user_id, team_id, sub, client_id, email, email_verified, is_private_email, real_user_status,
                given_name, family_name, transfer_sub, last_login_at, last_verified_at)
            VALUES (
                gen_random_uuid(), \(userID), \(teamID), \(identity.sub), \(identity.clientID), \(identity.email),
                \(identity.emailVerified ?? false), \(identity.isPrivateEmail ?? false), \(identity.realUserStatus),
                \(user?.name?.firstName), \(user?.name?.lastName), \(transferSub), now(), now())
            ON CONFLICT (team_id, sub) DO NOTHING RETURNING 1
            """)
        guard !inserted.isEmpty else { return false }
        try connection.query(
            """
            SELECT broker_emit_event('identity.linked', \(userID),
                jsonb_build_object('user_id', \(userID)::text, 'client_id', \(identity.clientID)::text, 'reason', 'team_transfer'))
            """)
        return true
    }

    private func upsert(
        _ database: some PostgresQuerying, _ identity: AppleIdentity, user: AppleUserField?,
        sealedRefreshToken: (keyID: String, sealed: [UInt8])?, validationJitterSeconds: Int
    ) throws -> Record {
        let row = try database.query(
            """
            SELECT * FROM broker_login(\(teamID), \(identity.sub), \(identity.clientID),
                \(groups.group(of: identity.clientID).primary), \(identity.email),
                \(identity.emailVerified), \(identity.isPrivateEmail), \(identity.realUserStatus),
                \(user?.name?.firstName), \(user?.name?.lastName), \(user?.email), \(identity.transferSub),
                \(sealedRefreshToken?.sealed), \(sealedRefreshToken?.keyID),
                \(lastLoginResolution)::interval, \(String(validationJitterSeconds) + " seconds")::interval,
                \(PostgresTextArray(hasher.candidates(teamID: teamID, sub: identity.sub))))
            """
        ).single()
        return Record(
            outcome: try row.decode(LoginOutcome.self, "r_outcome"), userID: try row.decode(UUID.self, "r_user_id"),
            isNewUser: try row.decode(Bool.self, "r_is_new_user"), email: try row.decode(String?.self, "r_email"),
            emailVerified: try row.decode(Bool?.self, "r_email_verified") ?? false,
            isPrivateEmail: try row.decode(Bool?.self, "r_is_private_email") ?? false,
            realUserStatus: try row.decode(RealUserStatus?.self, "r_real_user_status"),
            refreshTokenStored: try row.decode(Bool.self, "r_refresh_token_stored"),
            unverifiedEmail: try row.decode(String?.self, "r_unverified_email"))
    }

    /// Whether the identity's consent for this token's app group was revoked after the token
    /// was issued: such a token proves nothing about consent after the revocation (protocol
    /// reference §11.5) and must not restore it. `iat` has whole seconds: a token of the
    /// revocation's own second is given the benefit of the doubt.
    func predatesRevocation(_ identity: AppleIdentity) throws -> Bool {
        try !pool.query(
            """
            SELECT 1 FROM apple_identities i JOIN apple_grants g ON g.identity_id = i.id
            WHERE i.team_id = \(teamID) AND i.sub = \(identity.sub) AND g.app_id = \(groups.group(of: identity.clientID).primary)
              AND g.consent = 'revoked' AND g.consent_at >= \(identity.issuedAt)::timestamptz + interval '1 second'
            """
        ).isEmpty
    }

    /// A sign-in after the user revoked this app group's consent is a first authorization again:
    /// Apple sends the `user` field (name, e-mail) once more, and it is kept over the old one,
    /// which broker_login would otherwise prefer (it keeps a stored name, and the unverified
    /// e-mail of the first authorization only). The e-mail stays apart as `unverified_email`
    /// when the verified token has another (as at a first authorization). Runs before
    /// broker_login, in its transaction, only while the group's consent is still revoked.
    private func keepReauthorizationUserField(
        _ connection: some PostgresQuerying, _ identity: AppleIdentity, user: AppleUserField?
    ) throws {
        let name = user?.name
        let email = user?.email.flatMap { $0 == identity.email ? nil : $0 }
        guard name?.firstName != nil || name?.lastName != nil || email != nil else { return }
        try connection.query(
            """
            UPDATE apple_identities i SET given_name = COALESCE(\(name?.firstName), i.given_name),
                family_name = COALESCE(\(name?.lastName), i.family_name),
                unverified_email = COALESCE(\(email), i.unverified_email)
            FROM apple_grants g
            WHERE i.team_id = \(teamID) AND i.sub = \(identity.sub) AND g.identity_id = i.id
              AND g.app_id = \(groups.group(of: identity.clientID).primary) AND g.consent = 'revoked'
            """)
    }

    /// Whether the user of this sub has a deletion pending.
    func deletionPending(sub: String) throws -> Bool {
        try !pool.query(
            """
            SELECT 1 FROM apple_identities i JOIN users u ON u.id = i.user_id
            WHERE i.team_id = \(teamID) AND i.sub = \(sub) AND u.status = 'deleting'
            """
        ).isEmpty
    }

    /// Keeps the access token of the login's code exchange beside its refresh token.
    func keepAccessToken(sub: String, clientID: String, sealed: [UInt8], keyID: String, expiresIn: Int) throws {
        try pool.query(
            """
            UPDATE apple_tokens t SET access_token = \(sealed), access_key_id = \(keyID),
                access_expires_at = now() + \(String(max(0, min(expiresIn, 86_400))) + " seconds")::interval
            FROM apple_identities i
            WHERE i.team_id = \(teamID) AND i.sub = \(sub) AND t.identity_id = i.id AND t.client_id = \(clientID)
              AND t.revoked_at IS NULL
            """)
    }

    /// The fast path: a repeat login that changes nothing needs no write, so it is answered
    /// by one read-only query; one whose only change is a stale `last_login_at` by that query
    /// and one UPDATE of the two columns `broker_login` would write (the same values, no
    /// event). nil when broker_login must run (new identity, a change, a revoked consent). A
    /// user whose deletion is pending is reported as such.
    private func unchangedRepeatLogin(_ identity: AppleIdentity, user: AppleUserField?) throws -> Record? {
        // broker_identity_unchanged over a century is "nothing but the time changed"; with the
        // resolution it is broker_login's own test, which is this and a recent last_login_at.
        guard
            let row = try pool.query(
                """
                SELECT i.id, i.user_id, i.email, i.email_verified, i.is_private_email, i.real_user_status, u.status, i.unverified_email,
                       EXISTS (SELECT 1 FROM apple_tokens t WHERE t.identity_id = i.id AND t.revoked_at IS NULL) AS has_token,
                       broker_identity_unchanged(i, \(identity.clientID), g.identity_id IS NOT NULL,
                           \(identity.email), \(identity.emailVerified),
                           \(identity.isPrivateEmail), \(identity.realUserStatus), \(user?.name?.firstName),
                           \(user?.name?.lastName), \(user?.email), interval '100 years') AS unchanged,
                       i.last_login_at >= now() - \(lastLoginResolution)::interval AS recent
                FROM apple_identities i JOIN users u ON u.id = i.user_id
                LEFT JOIN apple_grants g
                    ON g.identity_id = i.id AND g.app_id = \(groups.group(of: identity.clientID).primary) AND g.consent = 'revoked'
                WHERE i.team_id = \(teamID) AND i.sub = \(identity.sub)
                """
            ).first
        else { return nil }
        let status = try row.decode(UserStatus.self, "status")
        let record = Record(
            outcome: status == .deleting ? .deletionPending : .ok, userID: try row.decode(UUID.self, "user_id"),
            isNewUser: false, email: try row.decode(String?.self, "email"),
            emailVerified: try row.decode(Bool.self, "email_verified"),
            isPrivateEmail: try row.decode(Bool.self, "is_private_email"),
            realUserStatus: try row.decode(RealUserStatus?.self, "real_user_status"),
            refreshTokenStored: try row.decode(Bool.self, "has_token"),
            unverifiedEmail: try row.decode(String?.self, "unverified_email"),
            wroteThrough: false)
        if status == .deleting { return record }
        guard try row.decode(Bool?.self, "unchanged") ?? false else { return nil }
        if try row.decode(Bool?.self, "recent") ?? false { return record }
        // Only last_login_at is stale. No row (purged meanwhile): broker_login decides.
        let updated = try pool.query(
            "UPDATE apple_identities SET last_login_at = now(), last_verified_at = now() WHERE id = \(try row.decode(UUID.self, "id"))"
        ).affectedRows
        return updated == 1 ? record : nil
    }
}
