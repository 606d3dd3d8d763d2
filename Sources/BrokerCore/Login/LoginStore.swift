import AppleID
import BrokerCrypto
import Foundation
import PostgresClient

/// The database side of a login: one call of `broker_login_v2` (sql/functions), which upserts
/// the user and identity, puts the sign-in on its app group's authorization timeline, stores
/// the refresh token and writes the outbox events in one transaction; a repeat login that
/// changes nothing takes the fast path (`unchangedRepeatLogin`) instead.
/// What `broker_login_v2` answered (its `r_outcome`): `deletion_pending` when the user's
/// deletion was requested, `predates_revocation` when the sign-in is older than the group's
/// revocation; nothing was written for either.
enum LoginOutcome: String, Sendable, CaseIterable, PostgresDecodable {
    case ok
    case deletionPending = "deletion_pending"
    case predatesRevocation = "predates_revocation"
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
    /// The fast path's writes, batched with those of concurrent logins.
    let repeatSignIns: RepeatSignInStore

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

    /// Upserts the user of a verified sign-in. `signedInAt` is when Apple vouched for the
    /// authorization, in Apple's time (the token's `iat`, or a code Apple just exchanged);
    /// `tokenAuthorizedAt` the Apple time of the exchange that yielded `sealedRefreshToken`.
    func login(
        _ identity: AppleIdentity, user: AppleUserField?, sealedRefreshToken: (keyID: String, sealed: [UInt8])?,
        validationInterval: Duration, signedInAt: Date, tokenAuthorizedAt: Date?
    ) throws -> Record {
        let sign = SignIn(at: signedInAt, tokenAuthorizedAt: tokenAuthorizedAt, validationInterval: validationInterval)
        if sealedRefreshToken == nil, let record = try unchangedRepeatLogin(identity, user: user, signedInAt: signedInAt) {
            return record
        }
        guard let transferSub = identity.transferSub else {
            return try upsert(pool, identity, user: user, sealedRefreshToken: sealedRefreshToken, sign)
        }
        // A token carrying transfer_sub (the 60 days after a team transfer): the login joins the
        // user of the old sub and, in the same transaction, retires the old team's identity and
        // refresh tokens as `transfer import` does.
        return try pool.withTransaction { connection in
            let linked = try joinStagedTransfer(connection, identity, user: user, transferSub: transferSub)
            var record = try upsert(connection, identity, user: user, sealedRefreshToken: sealedRefreshToken, sign)
            guard record.outcome == .ok else { return record }
            if linked { record.wroteThrough = true }
            try TeamTransferStore.retireOldTeam(connection, userID: record.userID, teamID: teamID, transferSub: transferSub)
            return record
        }
    }

    /// When Apple vouched for a sign-in and what the stored token is scheduled by.
    private struct SignIn {
        var at: Date
        var tokenAuthorizedAt: Date?
        /// BROKER_REFRESH_VALIDATION_SECONDS: a stored token's first validation is due after it.
        var validationInterval: Duration

        /// broker_login_v2 schedules the first validation at "1 day + p_validation_jitter"; the
        /// offset makes it the interval plus its jitter without a new version of the function
        /// (the previous release calls the same one). Drawn only when broker_login_v2 runs: a
        /// random draw is a getrandom(2) call, which a repeat login need not pay.
        var validationJitterSeconds: Int {
            Int(RefreshTokenSweep.nextValidation(after: validationInterval).components.seconds) - 86_400
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
        sealedRefreshToken: (keyID: String, sealed: [UInt8])?, _ sign: SignIn
    ) throws -> Record {
        let row = try database.query(
            """
            SELECT * FROM broker_login_v2(\(teamID), \(identity.sub), \(identity.clientID),
                \(groups.group(of: identity.clientID).primary), \(identity.email),
                \(identity.emailVerified), \(identity.isPrivateEmail), \(identity.realUserStatus),
                \(user?.name?.firstName), \(user?.name?.lastName), \(user?.email), \(identity.transferSub),
                \(sealedRefreshToken?.sealed), \(sealedRefreshToken?.keyID),
                \(lastLoginResolution)::interval,
                \(String(sign.validationJitterSeconds) + " seconds")::interval,
                \(PostgresTextArray(hasher.candidates(teamID: teamID, sub: identity.sub))),
                \(identity.orgID), \(sign.at)::timestamptz, \(sign.tokenAuthorizedAt)::timestamptz)
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

    /// Before a code is sent to Apple, in one statement: whether the identity's consent for
    /// this token's app group was revoked after the token was issued (such a token proves
    /// nothing about consent after the revocation, protocol reference §11.5, and must not
    /// restore it; `iat` has whole seconds: a token of the revocation's own second is given
    /// the benefit of the doubt), then whether the user's deletion is pending (the refresh
    /// token the code would yield would be thrown away, yet live at Apple). A login without
    /// a code learns the same from its first statement (`unchangedRepeatLogin`) or from
    /// broker_login_v2.
    func beforeExchange(_ identity: AppleIdentity) throws -> LoginOutcome {
        guard
            let row = try pool.query(
                """
                SELECT coalesce(g.consent = 'revoked' AND g.consent_at >= \(identity.issuedAt)::timestamptz + interval '1 second',
                           false) AS predates,
                       u.status = 'deleting' AS deleting
                FROM apple_identities i JOIN users u ON u.id = i.user_id
                LEFT JOIN apple_grants g ON g.identity_id = i.id AND g.app_id = \(groups.group(of: identity.clientID).primary)
                WHERE i.team_id = \(teamID) AND i.sub = \(identity.sub)
                """
            ).first
        else { return .ok }
        if try row.decode(Bool.self, "predates") { return .predatesRevocation }
        return try row.decode(Bool.self, "deleting") ? .deletionPending : .ok
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

    /// The fast path: a repeat login that changes nothing is answered by one read-only
    /// statement, which also says whether the token predates the group's revocation (then
    /// nothing is written and the login is refused, as broker_login_v2 would). Two things may
    /// still be written, without an event and without broker_login_v2, both by one call of
    /// `broker_repeat_sign_in` (one statement and commit shared with the repeat logins of the
    /// moment: `RepeatSignInStore`): a stale `last_login_at` (the two
    /// columns broker_login_v2 would write, the same values) and a sign-in newer than the
    /// group's authorization timeline knows (`broker_record_sign_in`): every verified sign-in
    /// is on it (issue 35). nil when broker_login_v2 must run (new identity, a change, a
    /// revoked consent). A user whose deletion is pending is reported as such.
    private func unchangedRepeatLogin(_ identity: AppleIdentity, user: AppleUserField?, signedInAt: Date) throws -> Record? {
        let app = groups.group(of: identity.clientID).primary
        // broker_identity_unchanged_v2 over a century is "nothing but the time changed"; with the
        // resolution it is broker_login_v2's own test, which is this and a recent last_login_at.
        // `predates` is predatesRevocation's test (a second's grace: iat has whole seconds).
        // `has_token` spells "not revoked" so that no index predicate matches it: with
        // `revoked_at IS NULL`, a generic plan made while apple_tokens was small may AND the
        // identity's index with the partial index of every live token (apple_tokens_due), and
        // then reads that whole index on every login (27% of PostgreSQL's CPU in one login
        // benchmark, growing with the table). An aggregate instead cost 10-15% more per call.
        guard
            let row = try pool.read(
                """
                SELECT i.id, i.user_id, i.email, i.email_verified, i.is_private_email, i.real_user_status, u.status, i.unverified_email,
                       EXISTS (SELECT 1 FROM apple_tokens t
                               WHERE t.identity_id = i.id AND coalesce(t.revoked_at, 'infinity') = 'infinity') AS has_token,
                       broker_identity_unchanged_v2(i, \(identity.clientID), coalesce(g.consent = 'revoked', false),
                           \(identity.email), \(identity.emailVerified),
                           \(identity.isPrivateEmail), \(identity.realUserStatus), \(user?.name?.firstName),
                           \(user?.name?.lastName), \(user?.email), \(identity.orgID), interval '100 years') AS unchanged,
                       i.last_login_at >= now() - \(lastLoginResolution)::interval AS recent,
                       coalesce(g.signed_in_at >= \(signedInAt)::timestamptz, false) AS on_timeline,
                       coalesce(g.consent = 'revoked' AND g.consent_at >= \(identity.issuedAt)::timestamptz + interval '1 second',
                           false) AS predates
                FROM apple_identities i JOIN users u ON u.id = i.user_id
                LEFT JOIN apple_grants g ON g.identity_id = i.id AND g.app_id = \(app)
                WHERE i.team_id = \(teamID) AND i.sub = \(identity.sub)
                """
            ).first
        else { return nil }
        let status = try row.decode(UserStatus.self, "status")
        let predates = try row.decode(Bool.self, "predates")
        let record = Record(
            outcome: predates ? .predatesRevocation : status == .deleting ? .deletionPending : .ok,
            userID: try row.decode(UUID.self, "user_id"),
            isNewUser: false, email: try row.decode(String?.self, "email"),
            emailVerified: try row.decode(Bool.self, "email_verified"),
            isPrivateEmail: try row.decode(Bool.self, "is_private_email"),
            realUserStatus: try row.decode(RealUserStatus?.self, "real_user_status"),
            refreshTokenStored: try row.decode(Bool.self, "has_token"),
            unverifiedEmail: try row.decode(String?.self, "unverified_email"),
            wroteThrough: false)
        if record.outcome != .ok { return record }
        guard try row.decode(Bool?.self, "unchanged") ?? false else { return nil }
        let touch = !(try row.decode(Bool?.self, "recent") ?? false)
        let onTimeline = try row.decode(Bool.self, "on_timeline")
        if touch || !onTimeline {
            // No row (purged meanwhile): broker_login_v2 decides.
            let written = try repeatSignIns.write(
                .init(
                    identityID: try row.decode(UUID.self, "id"), appID: app, signedInAt: signedInAt, touch: touch,
                    record: !onTimeline))
            guard written else { return nil }
        }
        return record
    }
}
