import BrokerCrypto
import Deliveries
import Foundation
import Observability
import PostgresClient
import StrictJSON

/// Where a deletion request is (`deletion_requests.state`): requested → revoking → purging
/// → done, or failed (dead-lettered, waiting for a retry).
public enum DeletionState: String, Sendable, CaseIterable, PostgresDecodable {
    case requested, revoking, purging, done, failed
}

/// Who asked for a deletion (`deletion_requests.source`): the compliance API, the CLI, or
/// Apple's `account-delete` notification (then its tokens are already dead: nothing to revoke).
public enum DeletionSource: String, Sendable, CaseIterable, PostgresDecodable, PostgresEncodable {
    case api, cli, apple
}

/// What a deletion came to at Apple (`deletion_requests.apple_revocation`, `user.deleted`).
public enum AppleRevocation: String, Sendable, CaseIterable, PostgresDecodable, PostgresEncodable {
    case revoked
    case alreadyInvalid = "already_invalid"
    case skippedAppleInitiated = "skipped_apple_initiated"
    /// For at least one app group the user used no live token was left to revoke: the user must
    /// stop using Sign in with Apple for it in Settings (TN3194); `appGroups` says which.
    case manualRequired = "manual_required"

    /// What a deletion's app groups came to together: manual while any group needs the user,
    /// revoked while any group's live token was revoked, else already invalid (nothing to end).
    static func summing(_ groups: [AppGroupRevocation]) -> AppleRevocation {
        if groups.isEmpty || groups.contains(.manualRequired) { return .manualRequired }
        if groups.contains(.revoked) { return .revoked }
        return .alreadyInvalid
    }
}

/// What a deletion came to at Apple for one app group the user used (`deletion_app_groups`,
/// protocol reference §12.3: revoking ends the authorization of one primary App ID only).
public enum AppGroupRevocation: String, Sendable, CaseIterable, PostgresDecodable, PostgresEncodable {
    /// A token Apple had just refreshed (so alive) was revoked: the only 200 that proves it.
    case revoked
    /// Apple had said the user stopped using the group (consent revoked): nothing to end.
    case alreadyInvalid = "already_invalid"
    /// No live token: the user must stop using Sign in with Apple for the group (TN3194).
    case manualRequired = "manual_required"
    /// The group moved to another team (`transfer complete`): not this team's to end.
    case transferred
}

/// A step of a deletion's record (`deletion_steps.step`); `purge` is written by `broker_purge_user`.
public enum DeletionStep: String, Sendable, CaseIterable, PostgresDecodable, PostgresEncodable {
    case codeExchange = "code_exchange"
    case revoke
    case revokeAccessToken = "revoke_access_token"
    case revokeSkipped = "revoke_skipped"
    case nothingToRevoke = "nothing_to_revoke"
    case purge
    /// A refresh before the revoke: only a token Apple still refreshes is alive, and only its
    /// revocation ends anything (protocol reference §12.3).
    case checkToken = "check_token"
}

/// What a step came to (`deletion_steps.outcome`).
public enum DeletionStepOutcome: String, Sendable, CaseIterable, PostgresDecodable, PostgresEncodable {
    /// Apple's revoke answered 200; `alreadyInvalid`: the grant was dead already. Both count as revoked.
    case revoked
    case alreadyInvalid = "already_invalid"
    /// Apple unavailable: tried again later. `error`: Apple refused otherwise; also retried.
    case retry, error
    /// Apple's revoke answered `invalid_request`: a defect of the request (TN3107), never a
    /// success; retried, then dead-lettered.
    case requestError = "request_error"
    case undecryptable
    case skipped
    case manualRevocationRequired = "manual_revocation_required"
    /// The handed-over code: exchanged, or dropped for one of the reasons after it.
    case exchanged
    case codeInvalid = "code_invalid"
    case idTokenInvalid = "id_token_invalid"
    case wrongUser = "wrong_user"
    case noIdentity = "no_identity"
    /// The code went to Apple and no usable answer came back: it may be used up, so it is
    /// not sent again (protocol reference §11.4).
    case answerLost = "answer_lost"
    /// The purge ran (`broker_purge_user`).
    case done
    /// The check: Apple refreshed the token (it is alive, its revocation will prove something),
    /// or called it dead (`invalid_grant`, or worded as a revocation): nothing to revoke with it.
    case alive
    case tokenDead = "token_dead"
    /// Apple answered the code's exchange 429: it did nothing, the code is tried again.
    case throttled

    /// Whether the token the step was about is done with: revoked, or dead at Apple.
    var endsTheToken: Bool { self == .revoked || self == .alreadyInvalid || self == .tokenDead }
}

/// A deletion request as the compliance API shows it.
public struct DeletionRecord: Sendable {
    public struct Step: Sendable {
        public var step: DeletionStep
        public var clientID: String?
        public var outcome: DeletionStepOutcome
        public var detail: String?
        public var at: Date
    }

    public var id: UUID
    public var userID: UUID
    public var source: DeletionSource
    public var reason: String
    public var requestedBy: String
    public var state: DeletionState
    public var attempts: Int
    public var lastError: String?
    public var createdAt: Date
    public var updatedAt: Date
    public var completedAt: Date?
    public var nextAttemptAt: Date
    /// What the deletion came to at Apple, once decided.
    public var appleRevocation: AppleRevocation?
    /// What happened so far; read for one request (`GET /v1/deletions/{id}`), nil in lists.
    public var steps: [Step]?
    /// What it came to per app group, once decided; read for one request, nil in lists.
    public var appGroups: [AppGroup]?

    /// One app group's outcome and, when the user must act, its TN3194 follow-up.
    public struct AppGroup: Sendable {
        /// The group's primary App ID.
        public var appID: String
        public var clientIDs: [String]
        public var revocation: AppGroupRevocation
        /// When the follow-up of a `manualRequired` group closed, and by what:
        /// `consent-revoked`, `account-delete`, or `retention` (a dormant user, nobody to ask).
        public var followUpClosedAt: Date?
        public var followUpClosedBy: String?

        /// `open`, `closed`, or nil when the group needs no follow-up.
        public var followUp: String? {
            revocation == .manualRequired ? (followUpClosedAt == nil ? "open" : "closed") : nil
        }
    }

    public var json: JSONValue {
        func time(_ date: Date?) -> JSONValue { date.map { .string(RFC3339.string(from: $0)) } ?? .null }
        var fields: [String: JSONValue] = [
            "deletion_id": .string(id.lowercasedString), "user_id": .string(userID.lowercasedString),
            "source": .string(source.rawValue), "reason": .string(reason), "requested_by": .string(requestedBy),
            "state": .string(state.rawValue), "attempts": .integer(Int64(attempts)),
            "last_error": lastError.map(JSONValue.string) ?? .null,
            "created_at": time(createdAt), "updated_at": time(updatedAt), "completed_at": time(completedAt),
            "next_attempt_at": state == .done || state == .failed ? .null : time(nextAttemptAt),
            "apple_revocation": appleRevocation.map { .string($0.rawValue) } ?? .null,
        ]
        if let appGroups {
            fields["app_groups"] = .array(
                appGroups.map { group in
                    .object([
                        "app_id": .string(group.appID), "client_ids": .array(group.clientIDs.map(JSONValue.string)),
                        "apple_revocation": .string(group.revocation.rawValue),
                        "follow_up": group.followUp.map(JSONValue.string) ?? .null,
                        "follow_up_closed_at": time(group.followUpClosedAt),
                        "follow_up_closed_by": group.followUpClosedBy.map(JSONValue.string) ?? .null,
                    ])
                })
        }
        if let steps {
            fields["steps"] = .array(
                steps.map { step in
                    .object([
                        "step": .string(step.step.rawValue), "client_id": step.clientID.map(JSONValue.string) ?? .null,
                        "outcome": .string(step.outcome.rawValue), "detail": step.detail.map(JSONValue.string) ?? .null,
                        "at": time(step.at),
                    ])
                })
        }
        return .object(fields)
    }
}

/// The deletion requests table: what the compliance API and the deletion job read and write.
package struct DeletionStore: Sendable {
    package let pool: PostgresPool
    package let teamID: String
    /// Tombstones name a purged sub by its keyed hash; nil (a CLI without
    /// TOKEN_ENCRYPTION_KEY) cannot look tombstones up by sub nor purge.
    package var hasher: SubjectHasher?

    package init(pool: PostgresPool, teamID: String, hasher: SubjectHasher? = nil) {
        self.pool = pool
        self.teamID = teamID
        self.hasher = hasher
    }

    /// Requests not yet done, dead-lettered ones, and the age of the oldest pending one, for `/metrics`.
    func backlog() throws -> QueueBacklog? {
        guard
            let row = try pool.query(
                """
                SELECT count(*) FILTER (WHERE state IN ('requested', 'revoking', 'purging')) AS backlog,
                       count(*) FILTER (WHERE state = 'failed') AS dead_letters,
                       COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE state IN ('requested', 'revoking', 'purging'))), 0)
                           AS oldest_age
                FROM deletion_requests
                """
            ).first
        else { return nil }
        return QueueBacklog(row)
    }

    /// Where a deletion request points.
    package enum Target {
        case user(UUID)
        case appleSub(String)
    }

    package enum Resolution {
        case user(UUID)
        case deleted(deletionID: UUID)
        case notFound
    }

    /// The live user a target names, or the deletion that already purged it.
    package func resolve(_ target: Target) throws -> Resolution {
        switch target {
        case .user(let id):
            if try !pool.query("SELECT 1 FROM users WHERE id = \(id)").isEmpty { return .user(id) }
            if let deletion = try pool.query("SELECT deletion_id FROM tombstones WHERE user_id = \(id) LIMIT 1").first {
                return .deleted(deletionID: try deletion.decode(UUID.self, "deletion_id"))
            }
        case .appleSub(let sub):
            if let row = try pool.query("SELECT user_id FROM apple_identities WHERE team_id = \(teamID) AND sub = \(sub)").first {
                return .user(try row.decode(UUID.self, "user_id"))
            }
            if let hasher,
                let deletion = try pool.query(
                    """
                    SELECT deletion_id FROM tombstones
                    WHERE team_id = \(teamID) AND sub_hash = ANY (\(PostgresTextArray(hasher.candidates(teamID: teamID, sub: sub))))
                    ORDER BY deleted_at DESC LIMIT 1
                    """
                ).first
            {
                return .deleted(deletionID: try deletion.decode(UUID.self, "deletion_id"))
            }
        }
        return .notFound
    }

    /// A fresh authorization code handed over with a request, sealed, for the job to
    /// exchange and revoke what it yields (§10.3).
    package struct SealedCode: Sendable {
        package var sealed: [UInt8]
        package var keyID: String
        /// nil: the client id the user signed in with last.
        package var clientID: String?
        package var redirectURI: String?

        package init(sealed: [UInt8], keyID: String, clientID: String?, redirectURI: String?) {
            self.sealed = sealed
            self.keyID = keyID
            self.clientID = clientID
            self.redirectURI = redirectURI
        }

        /// Binds a sealed code to the user it is for.
        package static func associatedData(userID: UUID) -> [UInt8] { Array("deletion_code|\(userID.lowercasedString)".utf8) }
    }

    /// What `request` did: the request, whether it is new, and, when a code came with it,
    /// whether it was attached. A code is attached only while the request still revokes
    /// (`requested`, `revoking`): not to a failed one (it waits for a retry) nor to one past its
    /// revocation (`purging`, `done`); then `codeRefusedIn` is the request's state.
    package struct Opened: Sendable {
        package var id: UUID
        package var created: Bool
        package var codeRefusedIn: DeletionState?
    }

    /// Opens the user's deletion request, or returns the one they have (open or failed: a
    /// failed one is re-driven by `retry`, never reopened beside it); nil when the user vanished meanwhile.
    /// A code is attached in the same transaction, so no worker can claim the request without it.
    /// - Parameter exchangeLease: the caller exchanges `code` itself right after (the API): the code
    ///   is attached already marked under way (as `takeCode(_:lease:)` marks it) in the same
    ///   transaction, so no job claims the new request, nor ends an open one's revoke phase,
    ///   between this commit and the exchange.
    package func request(
        userID: UUID, source: DeletionSource, reason: String, requestedBy: String, code: SealedCode? = nil,
        exchangeLease: Duration? = nil
    ) throws -> Opened? {
        try pool.withTransaction { connection in
            guard
                let row = try connection.query(
                    "SELECT * FROM broker_request_deletion_v2(\(userID), \(source), \(reason), \(requestedBy))"
                ).first
            else { return nil }
            let id = try row.decode(UUID.self, "r_deletion_id")
            var opened = Opened(id: id, created: try row.decode(Bool.self, "r_created"), codeRefusedIn: nil)
            if let code {
                let attached = try connection.query(
                    """
                    UPDATE deletion_requests SET authorization_code = \(code.sealed), code_key_id = \(code.keyID),
                        code_client_id = \(code.clientID), code_redirect_uri = \(code.redirectURI),
                        code_exchange_until = COALESCE(now() + \(exchangeLease)::interval, code_exchange_until),
                        -- A job's lease on a revoking request is never shortened (two lanes would share it).
                        next_attempt_at = CASE WHEN state = 'requested'
                                               THEN COALESCE(now() + \(exchangeLease)::interval, next_attempt_at)
                                               ELSE next_attempt_at END
                    WHERE id = \(id) AND state IN ('requested', 'revoking')
                    """)
                if attached.affectedRows == 0 {
                    opened.codeRefusedIn = try connection.query("SELECT state FROM deletion_requests WHERE id = \(id)")
                        .single().decode(DeletionState.self, "state")
                }
            }
            return opened
        }
    }

    package func record(_ id: UUID) throws -> DeletionRecord? {
        guard
            let row = try pool.query(
                """
                SELECT id, user_id, source, reason, requested_by, state, attempts, last_error, created_at, updated_at,
                       completed_at, next_attempt_at, apple_revocation
                FROM deletion_requests WHERE id = \(id)
                """
            ).first
        else { return nil }
        var record = try Self.record(row)
        record.steps = try pool.query(
            "SELECT step, client_id, outcome, detail, at FROM deletion_steps WHERE deletion_id = \(id) ORDER BY id"
        ).map { step in
            DeletionRecord.Step(
                step: try step.decode(DeletionStep.self, "step"), clientID: try step.decode(String?.self, "client_id"),
                outcome: try step.decode(DeletionStepOutcome.self, "outcome"), detail: try step.decode(String?.self, "detail"),
                at: try step.decode(Date.self, "at"))
        }
        record.appGroups = try appGroups(id)
        return record
    }

    /// The deletion's outcome per app group (none until decided, nor for a deletion the previous
    /// release decided).
    package func appGroups(_ id: UUID) throws -> [DeletionRecord.AppGroup] {
        try pool.query(
            """
            SELECT app_id, array_to_string(client_ids, ',') AS client_ids, revocation, follow_up_closed_at,
                   follow_up_closed_by
            FROM deletion_app_groups WHERE deletion_id = \(id) ORDER BY app_id
            """
        ).map { row in
            DeletionRecord.AppGroup(
                appID: try row.decode(String.self, "app_id"),
                clientIDs: try row.decode(String.self, "client_ids").split(separator: ",").map(String.init),
                revocation: try row.decode(AppGroupRevocation.self, "revocation"),
                followUpClosedAt: try row.decode(Date?.self, "follow_up_closed_at"),
                followUpClosedBy: try row.decode(String?.self, "follow_up_closed_by"))
        }
    }

    /// Requests, newest first, optionally in one state.
    /// - Parameter reach: a limited key's client ids: only deletions of users in them.
    package func list(state: DeletionState?, limit: Int, reach: PostgresTextArray? = nil) throws -> [DeletionRecord] {
        try pool.query(
            """
            SELECT id, user_id, source, reason, requested_by, state, attempts, last_error, created_at, updated_at,
                   completed_at, next_attempt_at, apple_revocation
            FROM deletion_requests
            WHERE (\(state?.rawValue)::text IS NULL OR state = \(state?.rawValue)::text) AND (\(reach)::text[] IS NULL OR client_ids && \(reach)::text[])
            ORDER BY created_at DESC LIMIT \(limit)
            """
        ).map(Self.record)
    }

    /// Puts a dead-lettered request back in the queue; false when it is not `failed`, or when
    /// its user has another request that is not (the previous release could open a second
    /// one beside a failed one: re-driving both would purge twice).
    package func retry(_ id: UUID, by actor: String) throws -> Bool {
        try pool.withTransaction { connection in
            let rows = try connection.query(
                """
                UPDATE deletion_requests d SET state = 'requested', attempts = 0, next_attempt_at = now(), updated_at = now()
                WHERE d.id = \(id) AND d.state = 'failed'
                  AND NOT EXISTS (SELECT 1 FROM deletion_requests o WHERE o.user_id = d.user_id AND o.id <> d.id AND o.state <> 'failed')
                """)
            guard rows.affectedRows == 1 else { return false }
            try connection.query(
                "INSERT INTO audit_log (actor, action, deletion_id) VALUES (\(actor), 'deletion.retried', \(id))")
            try connection.notify(channel: "deletion_requested")
            return true
        }
    }

    private static func record(_ row: PostgresRow) throws -> DeletionRecord {
        DeletionRecord(
            id: try row.decode(UUID.self, "id"), userID: try row.decode(UUID.self, "user_id"),
            source: try row.decode(DeletionSource.self, "source"),
            reason: try row.decode(String.self, "reason"), requestedBy: try row.decode(String.self, "requested_by"),
            state: try row.decode(DeletionState.self, "state"), attempts: try row.decode(Int.self, "attempts"),
            lastError: try row.decode(String?.self, "last_error"), createdAt: try row.decode(Date.self, "created_at"),
            updatedAt: try row.decode(Date.self, "updated_at"), completedAt: try row.decode(Date?.self, "completed_at"),
            nextAttemptAt: try row.decode(Date.self, "next_attempt_at"),
            appleRevocation: try row.decode(AppleRevocation?.self, "apple_revocation"), steps: nil)
    }

    // MARK: The job's side

    package struct Claimed: Sendable {
        package var id: UUID
        package var userID: UUID
        package var source: DeletionSource
        package var state: DeletionState
        package var attempts: Int
        package var requestedBy: String
    }

    /// Claims due requests (`FOR UPDATE SKIP LOCKED`, so workers never share one), leases
    /// them for `lease` and counts the attempt. A request whose worker died comes
    /// back when its lease ends.
    package func claim(limit: Int, lease: Duration) throws -> [Claimed] {
        try pool.query(
            """
            UPDATE deletion_requests d SET
                attempts = d.attempts + 1,
                state = CASE WHEN d.state = 'requested' THEN 'revoking' ELSE d.state END,
                next_attempt_at = now() + \(lease)::interval,
                updated_at = now()
            WHERE d.id IN (
                SELECT id FROM deletion_requests
                WHERE state IN ('requested', 'revoking', 'purging') AND next_attempt_at <= now()
                ORDER BY next_attempt_at LIMIT \(limit) FOR UPDATE SKIP LOCKED)
            RETURNING d.id, d.user_id, d.source, d.state, d.attempts, d.requested_by
            """
        ).map { row in
            Claimed(
                id: try row.decode(UUID.self, "id"), userID: try row.decode(UUID.self, "user_id"),
                source: try row.decode(DeletionSource.self, "source"),
                state: try row.decode(DeletionState.self, "state"), attempts: try row.decode(Int.self, "attempts"),
                requestedBy: try row.decode(String.self, "requested_by"))
        }
    }

    package struct StoredToken: Sendable {
        package var id: UUID
        package var clientID: String
        package var sealed: [UInt8]
        package var keyID: String
        package var teamID: String
        package var sub: String
    }

    /// The user's refresh tokens of this team not yet revoked nor found dead, newest first.
    package func liveTokens(of userID: UUID) throws -> [StoredToken] {
        try pool.query(
            """
            SELECT t.id, t.client_id, t.refresh_token, t.key_id, i.team_id, i.sub
            FROM apple_tokens t JOIN apple_identities i ON i.id = t.identity_id
            WHERE t.user_id = \(userID) AND i.team_id = \(teamID) AND t.revoked_at IS NULL
            ORDER BY t.obtained_at DESC
            """
        ).map { row in
            StoredToken(
                id: try row.decode(UUID.self, "id"), clientID: try row.decode(String.self, "client_id"),
                sealed: try row.decode([UInt8].self, "refresh_token"),
                keyID: try row.decode(String.self, "key_id"), teamID: try row.decode(String.self, "team_id"),
                sub: try row.decode(String.self, "sub"))
        }
    }

    /// The client ids the user is in, exactly (`broker_user_apps`): its identities' last client
    /// ids and the client ids holding a token for it. Their app groups are what a deletion decides.
    package func appsUsed(by userID: UUID) throws -> [String] {
        try pool.query("SELECT unnest(broker_user_apps(\(userID))) AS client_id ORDER BY 1")
            .map { try $0.decode(String.self, "client_id") }
    }

    /// The client ids that moved from this team to another (`transfer complete`).
    package func transferredClientIDs() throws -> Set<String> {
        Set(
            try pool.query("SELECT client_id FROM transferred_apps WHERE team_id = \(teamID)")
                .map { try $0.decode(String.self, "client_id") })
    }

    /// The app groups (primary App IDs) whose consent Apple said this team's user revoked, with
    /// no sign-in since (a sign-in restores it).
    package func revokedConsents(of userID: UUID) throws -> Set<String> {
        Set(
            try pool.query(
                """
                SELECT g.app_id FROM apple_grants g JOIN apple_identities i ON i.id = g.identity_id
                WHERE g.user_id = \(userID) AND i.team_id = \(teamID) AND g.consent = 'revoked'
                """
            ).map { try $0.decode(String.self, "app_id") })
    }

    /// The user's latest sign-in per client id as the broker knows it: an identity's last login
    /// with its client id, a token's code exchange.
    package func lastSignIns(of userID: UUID) throws -> [String: Date] {
        var latest: [String: Date] = [:]
        for row in try pool.query(
            """
            SELECT client_id, max(at) AS at FROM (
                SELECT client_id, last_login_at AS at FROM apple_identities WHERE user_id = \(userID) AND team_id = \(teamID)
                UNION ALL
                SELECT t.client_id, t.obtained_at FROM apple_tokens t JOIN apple_identities i ON i.id = t.identity_id
                WHERE t.user_id = \(userID) AND i.team_id = \(teamID)
            ) AS sign_ins WHERE at IS NOT NULL GROUP BY client_id
            """)
        {
            latest[try row.decode(String.self, "client_id")] = try row.decode(Date.self, "at")
        }
        return latest
    }

    /// The client ids this request's revoke steps revoked a live token of.
    package func revokedClientIDs(_ id: UUID) throws -> Set<String> {
        Set(
            try pool.query(
                """
                SELECT DISTINCT client_id FROM deletion_steps
                WHERE deletion_id = \(id) AND step = 'revoke' AND outcome = 'revoked' AND client_id IS NOT NULL
                """
            ).map { try $0.decode(String.self, "client_id") })
    }

    /// Whether the request has a step of this kind for this client id.
    package func hasStep(_ id: UUID, named step: DeletionStep, clientID: String) throws -> Bool {
        try !pool.query(
            "SELECT 1 FROM deletion_steps WHERE deletion_id = \(id) AND step = \(step) AND client_id = \(clientID) LIMIT 1"
        ).isEmpty
    }

    /// One app group's decision, for `decide`.
    package struct GroupDecision: Sendable {
        package var group: AppGroups.Group
        package var revocation: AppGroupRevocation
        /// The group's last sign-in the broker knew of: an older consent-revoked is stale.
        package var authorizedAt: Date?
    }

    /// Ends the revoke phase: what it came to per app group and in all (`apple_revocation`), and
    /// the TN3194 follow-ups of the groups left to the user, closed at once when the inbox already
    /// holds their closure (later ones close as they arrive: `broker_close_follow_ups`). One
    /// transaction; false, and nothing written, when the phase cannot end yet: a handed-over
    /// code arrived meanwhile or is being exchanged (what it yields must be revoked first).
    /// - Parameters:
    ///   - subHash: the keyed hash of the user's sub in this team, which closing notifications carry.
    ///   - noFollowUp: a dormant user's deletion: nobody to ask, the follow-ups close as `retention`.
    ///   - appleInitiated: Apple deleted the account: nothing was decided, nothing is left to do.
    package func decide(
        _ id: UUID, groups: [GroupDecision], subHash: String?, noFollowUp: Bool, appleInitiated: Bool = false
    ) throws -> AppleRevocation? {
        let overall = appleInitiated ? .skippedAppleInitiated : AppleRevocation.summing(groups.map(\.revocation))
        return try pool.withTransaction { connection -> AppleRevocation? in
            let ended = try connection.query(
                """
                UPDATE deletion_requests SET state = 'purging', apple_revocation = \(overall), updated_at = now()
                WHERE id = \(id) AND state = 'revoking' AND authorization_code IS NULL
                  AND (code_exchange_until IS NULL OR code_exchange_until < now())
                """)
            guard ended.affectedRows == 1 else { return nil }
            for decision in groups {
                let manual = decision.revocation == .manualRequired
                try connection.query(
                    """
                    INSERT INTO deletion_app_groups (deletion_id, app_id, client_ids, revocation, sub_hash, authorized_at,
                                                     follow_up_closed_at, follow_up_closed_by)
                    VALUES (\(id), \(decision.group.primary), \(PostgresTextArray(decision.group.clientIDs))::text[],
                            \(decision.revocation), \(manual ? subHash : nil), \(decision.authorizedAt),
                            CASE WHEN \(manual && noFollowUp) THEN now() END, CASE WHEN \(manual && noFollowUp) THEN 'retention' END)
                    ON CONFLICT (deletion_id, app_id) DO NOTHING
                    """)
            }
            // Apple may have said it already: the user stopped using the group, or deleted the account.
            try connection.query(
                """
                WITH closing AS (
                    SELECT DISTINCT ON (g.app_id) g.app_id, n.received_at,
                           CASE WHEN n.event_type = 'consent-revoked' THEN 'consent-revoked' ELSE 'account-delete' END AS kind
                    FROM deletion_app_groups g JOIN apple_notifications n ON n.sub_hash = g.sub_hash
                    WHERE g.deletion_id = \(id) AND g.revocation = 'manual_required' AND g.follow_up_closed_at IS NULL
                      AND (n.event_type IN ('account-delete', 'account-deleted')
                           OR (n.event_type = 'consent-revoked' AND n.client_id = ANY (g.client_ids)
                               AND (g.authorized_at IS NULL
                                    OR coalesce(n.event_time, n.received_at) + interval '1 second' > g.authorized_at)))
                    ORDER BY g.app_id, n.received_at)
                UPDATE deletion_app_groups g SET follow_up_closed_at = closing.received_at, follow_up_closed_by = closing.kind
                FROM closing WHERE g.deletion_id = \(id) AND g.app_id = closing.app_id
                """)
            return overall
        }
    }

    /// Takes the request's code: returns it and clears it in one statement, so that of two
    /// takers (the API request, the job) only one ever sends it to Apple. With a `lease`
    /// (the API request), the exchange is marked under way for that long, until `releaseLease`:
    /// the job does not end the revoke phase before the exchange has stored what it yields,
    /// and a request no job has claimed yet is held back from the job meanwhile.
    package func takeCode(_ id: UUID, lease: Duration? = nil) throws -> SealedCode? {
        guard
            let row = try pool.query(
                """
                WITH taken AS (
                    SELECT id, authorization_code, code_key_id, code_client_id, code_redirect_uri FROM deletion_requests
                    WHERE id = \(id) AND authorization_code IS NOT NULL AND state IN ('requested', 'revoking')
                    FOR UPDATE)
                UPDATE deletion_requests d
                SET authorization_code = NULL, code_key_id = NULL, code_client_id = NULL, code_redirect_uri = NULL,
                    code_exchange_until = now() + \(lease)::interval,
                    next_attempt_at = CASE WHEN d.state = 'requested' THEN COALESCE(now() + \(lease)::interval, d.next_attempt_at)
                                           ELSE d.next_attempt_at END
                FROM taken WHERE d.id = taken.id
                RETURNING taken.authorization_code, taken.code_key_id, taken.code_client_id, taken.code_redirect_uri
                """
            ).first
        else { return nil }
        return SealedCode(
            sealed: try row.decode([UInt8].self, "authorization_code"), keyID: try row.decode(String.self, "code_key_id"),
            clientID: try row.decode(String?.self, "code_client_id"),
            redirectURI: try row.decode(String?.self, "code_redirect_uri"))
    }

    /// Ends the exchange `takeCode(_:lease:)` marked, and hands a request it held back to
    /// the job at once, unless its code went back to it to be tried later (`putCodeBack`). A
    /// request a job works on keeps that job's lease.
    package func releaseLease(_ id: UUID) throws {
        try pool.query(
            """
            UPDATE deletion_requests SET code_exchange_until = NULL,
                next_attempt_at = CASE WHEN state = 'requested' AND authorization_code IS NULL THEN now() ELSE next_attempt_at END
            WHERE id = \(id)
            """)
    }

    /// Gives a taken code back to its request, to be sent again no sooner than `afterSeconds`:
    /// Apple answered 429 and did nothing with it (unlike a lost answer, after which the code may
    /// be used up). Only while the request still revokes; false otherwise.
    package func putCodeBack(_ id: UUID, _ code: SealedCode, afterSeconds: Int) throws -> Bool {
        try pool.query(
            """
            UPDATE deletion_requests SET authorization_code = \(code.sealed), code_key_id = \(code.keyID),
                code_client_id = \(code.clientID), code_redirect_uri = \(code.redirectURI),
                -- A job's lease on a revoking request is never shortened (two lanes would share it).
                next_attempt_at = CASE WHEN state = 'requested' THEN now() ELSE next_attempt_at END
                    + \(Duration.seconds(afterSeconds))::interval
            WHERE id = \(id) AND authorization_code IS NULL AND state IN ('requested', 'revoking')
            """
        ).affectedRows == 1
    }

    /// The identities of the user in this team: sub, client id used last, identity id.
    package func identities(of userID: UUID) throws -> [(id: UUID, sub: String, clientID: String)] {
        try pool.query(
            """
            SELECT id, sub, client_id FROM apple_identities WHERE user_id = \(userID) AND team_id = \(teamID)
            ORDER BY last_login_at DESC NULLS LAST
            """
        ).map { (try $0.decode(UUID.self, "id"), try $0.decode(String.self, "sub"), try $0.decode(String.self, "client_id")) }
    }

    /// Keeps the tokens a code exchange yielded, so a crash before their revocation loses nothing.
    package func keepExchangedTokens(
        identityID: UUID, userID: UUID, clientID: String, refresh: (sealed: [UInt8], keyID: String),
        access: (sealed: [UInt8], keyID: String, expiresIn: Int)
    ) throws {
        try pool.query(
            """
            INSERT INTO apple_tokens (id, identity_id, user_id, client_id, refresh_token, key_id,
                                      access_token, access_key_id, access_expires_at)
            VALUES (\(UUID()), \(identityID), \(userID), \(clientID), \(refresh.sealed), \(refresh.keyID),
                    \(access.sealed), \(access.keyID), now() + \(String(access.expiresIn) + " seconds")::interval)
            ON CONFLICT (identity_id, client_id) DO UPDATE SET
                refresh_token = EXCLUDED.refresh_token, key_id = EXCLUDED.key_id, obtained_at = now(), revoked_at = NULL,
                access_token = EXCLUDED.access_token, access_key_id = EXCLUDED.access_key_id,
                access_expires_at = EXCLUDED.access_expires_at
            """)
    }

    package func hasSteps(_ id: UUID, named step: DeletionStep) throws -> Bool {
        try !pool.query("SELECT 1 FROM deletion_steps WHERE deletion_id = \(id) AND step = \(step) LIMIT 1").isEmpty
    }

    /// Appends a step to the request's record and to the audit log (no personal data). With
    /// `tokenID` and a successful outcome the refresh token is marked revoked in the same
    /// transaction; with `accessTokenOf`, that row's access token is dropped.
    package func addStep(
        _ id: UUID, step: DeletionStep, clientID: String? = nil, outcome: DeletionStepOutcome, detail: String? = nil,
        tokenID: UUID? = nil,
        accessTokenOf: UUID? = nil
    ) throws {
        try pool.withTransaction { connection in
            let succeeded = outcome.endsTheToken
            if let tokenID, succeeded {
                try connection.query("UPDATE apple_tokens SET revoked_at = now() WHERE id = \(tokenID)")
            }
            if let accessTokenOf, succeeded {
                try connection.query(
                    "UPDATE apple_tokens SET access_token = NULL, access_key_id = NULL, access_expires_at = NULL WHERE id = \(accessTokenOf)"
                )
            }
            try connection.query(
                """
                INSERT INTO deletion_steps (deletion_id, step, client_id, outcome, detail)
                VALUES (\(id), \(step), \(clientID), \(outcome), \(detail))
                """)
            try connection.query(
                """
                INSERT INTO audit_log (actor, action, deletion_id, detail)
                VALUES ('deletion-job', \("deletion." + step.rawValue), \(id),
                        jsonb_build_object('outcome', \(outcome)::text, 'client_id', \(clientID)::text))
                """)
        }
    }

    /// Runs the purge transaction; false when another worker already finished it.
    package func purge(_ id: UUID) throws -> Bool {
        guard let hasher else { preconditionFailure("a purge needs the subject hasher (TOKEN_ENCRYPTION_KEY)") }
        // The keyed hash of each identity's sub, for its tombstone; the purge refuses (and the
        // job retries) if the identities changed in between.
        let identities = try pool.query(
            """
            SELECT i.team_id, i.sub FROM apple_identities i JOIN deletion_requests d ON d.user_id = i.user_id
            WHERE d.id = \(id) ORDER BY i.id
            """
        ).map { (try $0.decode(String.self, "team_id"), try $0.decode(String.self, "sub")) }
        return try pool.withTransaction { connection in
            // A staged transfer line (sql/0015) names the user too; broker_purge_user is released
            // and does not know the table, so its rows go here, in the purge's transaction.
            try connection.query(
                "DELETE FROM transfer_staged WHERE user_id = (SELECT user_id FROM deletion_requests WHERE id = \(id))")
            return try connection.query(
                """
                SELECT broker_purge_user_v2(\(id), \(PostgresTextArray(identities.map(\.0))),
                    \(PostgresTextArray(identities.map { hasher.hash(teamID: $0.0, sub: $0.1) })))
                """
            ).single().decode(Bool.self, "broker_purge_user_v2")
        }
    }

    /// Schedules the next attempt, or dead-letters the request after its last attempt.
    /// - Returns: the resulting state.
    package func reschedule(_ request: Claimed, after delay: Duration, error: String, maximumAttempts: Int, fail: Bool = false)
        throws
        -> DeletionState
    {
        let failed = fail || request.attempts >= maximumAttempts
        let milliseconds = Int(delay.components.seconds) * 1000 + Int(delay.components.attoseconds / 1_000_000_000_000_000)
        return try pool.withTransaction { connection in
            let state =
                try connection.query(
                    """
                    UPDATE deletion_requests SET
                        state = CASE WHEN \(failed) THEN 'failed' ELSE state END,
                        -- A dead letter keeps no handed-over code (a five-minute bearer secret).
                        authorization_code = CASE WHEN \(failed) THEN NULL ELSE authorization_code END,
                        code_key_id = CASE WHEN \(failed) THEN NULL ELSE code_key_id END,
                        code_client_id = CASE WHEN \(failed) THEN NULL ELSE code_client_id END,
                        code_redirect_uri = CASE WHEN \(failed) THEN NULL ELSE code_redirect_uri END,
                        next_attempt_at = now() + \(String(milliseconds) + " milliseconds")::interval,
                        last_error = \(error), updated_at = now()
                    WHERE id = \(request.id) AND state IN ('revoking', 'purging')
                    RETURNING state
                    """
                ).first?.decode(DeletionState.self, "state") ?? .done
            if state == .failed {
                try connection.query(
                    """
                    INSERT INTO audit_log (actor, action, deletion_id, detail)
                    VALUES ('deletion-job', 'deletion.failed', \(request.id), jsonb_build_object('error', \(error)::text))
                    """)
            }
            return state
        }
    }
}
