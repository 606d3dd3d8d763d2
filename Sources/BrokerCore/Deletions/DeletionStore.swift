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
    /// Nothing could be revoked: the user must stop using Sign in with Apple for the app in Settings (TN3194).
    case manualRequired = "manual_required"
}

/// A step of a deletion's record (`deletion_steps.step`); `purge` is written by `broker_purge_user`.
public enum DeletionStep: String, Sendable, CaseIterable, PostgresDecodable, PostgresEncodable {
    case codeExchange = "code_exchange"
    case revoke
    case revokeAccessToken = "revoke_access_token"
    case revokeSkipped = "revoke_skipped"
    case nothingToRevoke = "nothing_to_revoke"
    case purge
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

    /// Whether the token the step was about is dead at Apple now.
    var revokedTheToken: Bool { self == .revoked || self == .alreadyInvalid }
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

        /// Binds a sealed code to the user it is for.
        package static func associatedData(userID: UUID) -> [UInt8] { Array("deletion_code|\(userID.lowercasedString)".utf8) }
    }

    /// Opens the user's deletion request, or returns the one they have (open or failed: a
    /// failed one is re-driven by `retry`, never reopened beside it); nil when the user vanished meanwhile.
    /// A code is attached in the same transaction, so no worker can claim the request without it.
    package func request(userID: UUID, source: DeletionSource, reason: String, requestedBy: String, code: SealedCode? = nil)
        throws
        -> (id: UUID, created: Bool)?
    {
        try pool.withTransaction { connection in
            guard
                let row = try connection.query(
                    "SELECT * FROM broker_request_deletion_v2(\(userID), \(source), \(reason), \(requestedBy))"
                ).first
            else { return nil }
            let id = try row.decode(UUID.self, "r_deletion_id")
            if let code {
                try connection.query(
                    """
                    UPDATE deletion_requests SET authorization_code = \(code.sealed), code_key_id = \(code.keyID),
                        code_client_id = \(code.clientID), code_redirect_uri = \(code.redirectURI)
                    WHERE id = \(id) AND state IN ('requested', 'revoking')
                    """)
            }
            return (id, try row.decode(Bool.self, "r_created"))
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
        return record
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
            RETURNING d.id, d.user_id, d.source, d.state, d.attempts
            """
        ).map { row in
            Claimed(
                id: try row.decode(UUID.self, "id"), userID: try row.decode(UUID.self, "user_id"),
                source: try row.decode(DeletionSource.self, "source"),
                state: try row.decode(DeletionState.self, "state"), attempts: try row.decode(Int.self, "attempts"))
        }
    }

    package struct StoredToken: Sendable {
        package var id: UUID
        package var clientID: String
        package var sealed: [UInt8]
        package var keyID: String
        package var teamID: String
        package var sub: String
        /// The code exchange's access token, while it is valid and not yet revoked.
        package var access: (sealed: [UInt8], keyID: String)?
        /// The refresh token was revoked already (only the access token is left).
        package var refreshRevoked: Bool
    }

    /// The user's tokens not yet revoked.
    package func liveTokens(of userID: UUID) throws -> [StoredToken] {
        try pool.query(
            """
            SELECT t.id, t.client_id, t.refresh_token, t.key_id, i.team_id, i.sub,
                   CASE WHEN t.access_expires_at > now() THEN t.access_token END AS access_token, t.access_key_id,
                   t.revoked_at IS NOT NULL AS refresh_revoked
            FROM apple_tokens t JOIN apple_identities i ON i.id = t.identity_id
            WHERE t.user_id = \(userID) AND i.team_id = \(teamID)
              AND (t.revoked_at IS NULL OR (t.access_token IS NOT NULL AND t.access_expires_at > now()))
            ORDER BY t.obtained_at
            """
        ).map { row in
            let access = try row.decode([UInt8]?.self, "access_token")
            let accessKeyID = try row.decode(String?.self, "access_key_id")
            return StoredToken(
                id: try row.decode(UUID.self, "id"), clientID: try row.decode(String.self, "client_id"),
                sealed: try row.decode([UInt8].self, "refresh_token"),
                keyID: try row.decode(String.self, "key_id"), teamID: try row.decode(String.self, "team_id"),
                sub: try row.decode(String.self, "sub"),
                access: access.flatMap { sealed in accessKeyID.map { (sealed, $0) } },
                refreshRevoked: try row.decode(Bool.self, "refresh_revoked"))
        }
    }

    /// Takes the request's code: returns it and clears it in one statement, so that of two
    /// takers (the API request, the job) only one ever sends it to Apple. With a `lease`
    /// (the API request), only from a request no job has claimed yet, which is then held
    /// back from the job for that long, until `releaseLease`: the job must not revoke before
    /// the exchange has stored what it yields.
    package func takeCode(_ id: UUID, lease: Duration? = nil) throws -> SealedCode? {
        guard
            let row = try pool.query(
                """
                WITH taken AS (
                    SELECT id, authorization_code, code_key_id, code_client_id, code_redirect_uri FROM deletion_requests
                    WHERE id = \(id) AND authorization_code IS NOT NULL AND (\(lease)::interval IS NULL OR state = 'requested')
                    FOR UPDATE)
                UPDATE deletion_requests d
                SET authorization_code = NULL, code_key_id = NULL, code_client_id = NULL, code_redirect_uri = NULL,
                    next_attempt_at = COALESCE(now() + \(lease)::interval, d.next_attempt_at)
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

    /// Hands a request held by `takeCode(_:lease:)` back to the job.
    package func releaseLease(_ id: UUID) throws {
        try pool.query("UPDATE deletion_requests SET next_attempt_at = now() WHERE id = \(id) AND state = 'requested'")
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
            let succeeded = outcome.revokedTheToken
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

    /// Ends the revoke phase with what it came to at Apple.
    package func startPurging(_ id: UUID, appleRevocation: AppleRevocation) throws {
        try pool.query(
            """
            UPDATE deletion_requests SET state = 'purging', apple_revocation = \(appleRevocation), updated_at = now()
            WHERE id = \(id) AND state = 'revoking'
            """)
    }

    /// What the revoke steps recorded came to (the request's `apple_revocation`).
    package func appleRevocation(_ id: UUID, source: DeletionSource) throws -> AppleRevocation {
        if source == .apple { return .skippedAppleInitiated }
        let outcomes = Set(
            try pool.query("SELECT outcome FROM deletion_steps WHERE deletion_id = \(id) AND step = 'revoke'")
                .map { try $0.decode(DeletionStepOutcome.self, "outcome") })
        if outcomes.contains(.revoked) { return .revoked }
        if outcomes.contains(.alreadyInvalid) { return .alreadyInvalid }
        return .manualRequired
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
                SELECT broker_purge_user(\(id), \(PostgresTextArray(identities.map(\.0))),
                    \(PostgresTextArray(identities.map { hasher.hash(teamID: $0.0, sub: $0.1) })))
                """
            ).single().decode(Bool.self, "broker_purge_user")
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
