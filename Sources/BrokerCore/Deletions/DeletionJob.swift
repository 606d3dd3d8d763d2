import AppleID
import BrokerCrypto
import Deliveries
import Foundation
import Observability
import PostgresClient
import Workers

/// The account-deletion job: works through deletion requests (from the compliance API,
/// the CLI and Apple's `account-delete`), state `requested → revoking → purging → done`,
/// or `failed` after `maximumAttempts`.
///
/// - **Revoke**, decided per app group the user used (`broker_user_apps`, `APPLE_APP_GROUPS`):
///   revoking ends the authorization of one primary App ID only, and Apple answers 200 to any
///   revoke, so a 200 proves a revocation only for a token that was alive (protocol reference
///   §12.3, TN3194). For each group, each of its live refresh tokens is first checked with a
///   refresh: a 200 shows it alive (and brings a fresh access token), and then its revoke (and
///   the fresh access token's) ends the group's authorization: `revoked`. A token Apple calls
///   dead (a password change, forum thread 651237) revokes nothing. A group left without a live
///   token is `manual_required`, a step and a TN3194 follow-up of its own: the user must stop
///   using Sign in with Apple for it in Settings; one Apple said the user already stopped using
///   (consent revoked) is `already_invalid`; one that moved to another team (`transfer
///   complete`) is `transferred`. The request's `apple_revocation` sums them up (never a bare
///   `revoked` while a group is manual), and `user.deleted` carries both. `invalid_request` on
///   a revoke is a request error (TN3107), never success; 5xx, 429 (honouring `Retry-After`)
///   and timeouts are retried with exponential backoff and jitter; each lane makes one call
///   at a time. Every call's outcome is a step of the request. Apple-initiated deletions skip
///   this (the tokens are already dead). A fresh authorization code handed over with the
///   request is exchanged first, normally in the API request itself (`HandedOverCode`), and
///   what it yields is revoked too; the phase does not end while one is being exchanged.
/// - **Purge**: one transaction (`broker_purge_user_v2`): tombstones, the user row with
///   everything personal cascading away, `user.deleted`, an audit record.
///
/// Requests are claimed with `FOR UPDATE SKIP LOCKED` and leased; a worker killed at any
/// point leaves its requests to the next one, which resumes where the steps say (a group
/// whose live token was revoked is not checked again), and the purge runs once (it requires
/// the `purging` state and ends it).
package final class DeletionJob: Sendable {
    let store: DeletionStore
    let apple: AppleClient
    let tokenKeys: TokenKeyRing
    let settings: BrokerConfiguration.DeletionSettings
    /// Which client ids share one authorization at Apple: a deletion is decided per group.
    let groups: AppGroups
    /// Verifies the `id_token` of a handed-over code's exchange.
    let validator: IdentityTokenValidator
    let logger: Logger
    private let outcomes: CounterFamily
    private let revocations: CounterFamily

    package init(
        store: DeletionStore, apple: AppleClient, tokenKeys: TokenKeyRing, settings: BrokerConfiguration.DeletionSettings,
        groups: AppGroups, validator: IdentityTokenValidator, metrics: MetricsRegistry, logger: Logger
    ) {
        self.store = store
        self.apple = apple
        self.tokenKeys = tokenKeys
        self.settings = settings
        self.groups = groups
        self.validator = validator
        self.logger = logger
        outcomes = metrics.counter(
            "deletions_total", help: "Deletion attempts by outcome: done, retry, failed.", labels: ["outcome"])
        revocations = metrics.counter(
            "deletion_apple_revocations_total",
            help: "Deletions by what they came to at Apple: revoked, already_invalid, skipped_apple_initiated, manual_required.",
            labels: ["outcome"])
        metrics.collect { [store] in
            guard let backlog = try? store.backlog() else { return [] }
            return [
                CollectedSample(name: "deletion_backlog", help: "Deletion requests not yet done.", value: backlog.pending),
                CollectedSample(
                    name: "deletion_dead_letters", help: "Deletion requests that failed and wait for a retry.",
                    value: backlog.deadLetters),
                CollectedSample(
                    name: "deletion_oldest_pending_age_seconds", help: "Age of the oldest pending deletion request.",
                    value: backlog.oldestPendingAgeSeconds),
            ]
        }
    }

    /// One request: claims it and works on it on the calling lane's thread. The job runs as
    /// a `WorkerGroup` of `concurrency` lanes, so that many revokes can wait on Apple at once.
    package func step() throws -> Bool {
        guard let request = try store.claim(limit: 1, lease: settings.lease).first else { return false }
        process(request)
        return true
    }

    /// Why an attempt stops early: when to try again, or that retrying cannot help.
    struct Setback: Error {
        var reason: String
        var retryAfter: Int?
        var permanent = false
    }

    private func process(_ request: DeletionStore.Claimed) {
        do {
            if request.state == .revoking {
                let decisions = try revokeTokens(request)
                guard
                    let appleRevocation = try store.decide(
                        request.id, groups: decisions, subHash: try subHash(of: request.userID),
                        noFollowUp: request.source == .cli && request.requestedBy == DormantUsers.actor,
                        appleInitiated: request.source == .apple)
                else {
                    // A code came (or is being exchanged) meanwhile: what it yields goes first.
                    throw Setback(
                        reason: "a handed-over authorization code arrived; revoking what it yields first", retryAfter: 1)
                }
                revocations.increment(appleRevocation.rawValue)
            }
            if try store.purge(request.id) {
                outcomes.increment("done")
                logger.info("user purged", [("deletion_id", request.id.lowercasedString)])
            }
        } catch let setback as Setback {
            settle(request, setback)
        } catch let throttled as HandedOverCode.Throttled {
            settle(request, Setback(reason: "Apple throttled the code exchange (429)", retryAfter: throttled.retryAfter))
        } catch {
            settle(request, Setback(reason: "\(error)"))
        }
    }

    /// The keyed hash of the user's sub in this team (what a closing notification carries).
    private func subHash(of userID: UUID) throws -> String? {
        guard let hasher = store.hasher, let identity = try store.identities(of: userID).first else { return nil }
        return hasher.hash(teamID: store.teamID, sub: identity.sub)
    }

    /// The revoke phase, per app group the user used; returns each group's decision. Apple-
    /// initiated deletions decide nothing (the account is gone at Apple, its tokens with it).
    private func revokeTokens(_ request: DeletionStore.Claimed) throws -> [DeletionStore.GroupDecision] {
        if request.source == .apple {
            if try !store.hasSteps(request.id, named: .revokeSkipped) {
                try store.addStep(
                    request.id, step: .revokeSkipped, outcome: .skipped,
                    detail: "Apple deleted the account: its tokens are already invalid")
            }
            return []
        }
        // Usually done already, in the API request (HandedOverCode).
        try HandedOverCode(store: store, apple: apple, tokenKeys: tokenKeys, validator: validator)
            .exchange(deletionID: request.id, userID: request.userID)
        let used = try store.appsUsed(by: request.userID)
        var seen = Set<String>()
        let usedGroups = used.map(groups.group(of:)).filter { seen.insert($0.primary).inserted }.sorted {
            $0.primary < $1.primary
        }
        let transferred = try store.transferredClientIDs()
        let consentRevoked = try store.revokedConsents(of: request.userID)
        let signIns = try store.lastSignIns(of: request.userID)
        var revoked = try store.revokedClientIDs(request.id)
        let tokens = try store.liveTokens(of: request.userID)
        var decisions: [DeletionStore.GroupDecision] = []
        for group in usedGroups {
            let members = Set(group.clientIDs)
            let authorizedAt = signIns.filter { members.contains($0.key) }.map(\.value).max()
            var revocation: AppGroupRevocation
            if members.isSubset(of: transferred) {
                revocation = .transferred
                if try !store.hasStep(request.id, named: .revokeSkipped, clientID: group.primary) {
                    try store.addStep(
                        request.id, step: .revokeSkipped, clientID: group.primary, outcome: .skipped,
                        detail: "the app moved to another team (transfer complete): this team's credentials can neither"
                            + " refresh nor revoke its tokens (TN3159)")
                }
            } else if !revoked.isDisjoint(with: members) {
                revocation = .revoked  // An earlier attempt revoked a live token of the group.
            } else {
                revocation = .manualRequired
                for token in tokens where members.contains(token.clientID) {
                    if try checkAndRevoke(token, request: request) {
                        revoked.insert(token.clientID)
                        revocation = .revoked
                        break
                    }
                }
                if revocation == .manualRequired {
                    revocation = consentRevoked.contains(group.primary) ? .alreadyInvalid : .manualRequired
                    try recordNothingToRevoke(group, revocation: revocation, request: request)
                }
            }
            decisions.append(.init(group: group, revocation: revocation, authorizedAt: authorizedAt))
        }
        return decisions
    }

    /// The step of a group left without a live token: once per group.
    private func recordNothingToRevoke(
        _ group: AppGroups.Group, revocation: AppGroupRevocation, request: DeletionStore.Claimed
    ) throws {
        guard try !store.hasStep(request.id, named: .nothingToRevoke, clientID: group.primary) else { return }
        if revocation == .alreadyInvalid {
            try store.addStep(
                request.id, step: .nothingToRevoke, clientID: group.primary, outcome: .alreadyInvalid,
                detail: "Apple said the user stopped using this app group (consent revoked): nothing to end")
        } else {
            try store.addStep(
                request.id, step: .nothingToRevoke, clientID: group.primary, outcome: .manualRevocationRequired,
                detail:
                    "no live token for this app group: the user must stop using Sign in with Apple for it in Settings (TN3194)")
        }
    }

    /// Checks one refresh token with a refresh and, when Apple still refreshes it, revokes it
    /// and the fresh access token: true when that revocation ended the group's authorization.
    /// A dead token (`invalid_grant`, or worded as a revocation) is recorded and ends nothing.
    private func checkAndRevoke(_ token: DeletionStore.StoredToken, request: DeletionStore.Claimed) throws -> Bool {
        let owner = SealedAppleToken.Owner(teamID: token.teamID, sub: token.sub, clientID: token.clientID)
        let refreshToken = try open(
            SealedAppleToken(.refresh, sealed: token.sealed, keyID: token.keyID), for: owner, request: request)
        let fresh: AppleTokenResponse
        do {
            fresh = try apple.refresh(refreshToken, clientID: token.clientID, retry: RetryPolicy(maximumAttempts: 3))
        } catch let error as AppleAPIError where error.refreshVerdict == .tokenInvalid || error.refreshVerdict == .revoked {
            // Revoking it would answer 200 and end nothing (§12.3): no proof, no revocation.
            try store.addStep(
                request.id, step: .checkToken, clientID: token.clientID, outcome: .tokenDead, detail: "\(error.kind)",
                tokenID: token.id)
            return false
        } catch let error as AppleAPIError {
            try failedCall(error, step: .checkToken, clientID: token.clientID, request: request)
        }
        try store.addStep(request.id, step: .checkToken, clientID: token.clientID, outcome: .alive)
        guard
            try revoke(
                refreshToken, hint: "refresh_token", step: .revoke, token: token.id, clientID: token.clientID, request: request)
        else { return false }
        // The fresh access token too: revoking either ends the authorization; both, to be sure.
        // The group is decided already, so a failure here is recorded and not retried.
        do {
            _ = try revoke(
                fresh.accessToken, hint: "access_token", step: .revokeAccessToken, clientID: token.clientID, request: request)
        } catch is Setback {}
        return true
    }

    private func open(_ token: SealedAppleToken, for owner: SealedAppleToken.Owner, request: DeletionStore.Claimed) throws
        -> String
    {
        do {
            return try token.open(for: owner, keys: tokenKeys)
        } catch {
            try store.addStep(request.id, step: .revoke, clientID: owner.clientID, outcome: .undecryptable, detail: "\(error)")
            throw Setback(reason: "a stored token cannot be decrypted (TOKEN_ENCRYPTION_KEY)", permanent: true)
        }
    }

    /// One revoke call and its step; true when Apple answered 200 (for a token just checked
    /// alive, that is proof). `invalid_grant` there means the token died in between: recorded
    /// as `already_invalid`, no proof. `invalid_request` is always a defect of the request
    /// (TN3107, §11.2) and the grant may be live: an error of the step, retried and then
    /// dead-lettered, like any other refusal. Apple unavailable is retried later, after at
    /// least its `Retry-After`.
    private func revoke(
        _ token: String, hint: String, step: DeletionStep, token tokenID: UUID? = nil, clientID: String,
        request: DeletionStore.Claimed
    ) throws -> Bool {
        do {
            try apple.revoke(token, clientID: clientID, hint: hint, retry: RetryPolicy(maximumAttempts: 3))
            try store.addStep(request.id, step: step, clientID: clientID, outcome: .revoked, tokenID: tokenID)
            return true
        } catch AppleAPIError.invalidGrant {
            try store.addStep(request.id, step: step, clientID: clientID, outcome: .alreadyInvalid, tokenID: tokenID)
            return false
        } catch let error as AppleAPIError {
            try failedCall(error, step: step, clientID: clientID, request: request)
        }
    }

    /// Records a call Apple did not answer with a verdict, and stops the attempt: retried
    /// later (after at least Apple's `Retry-After`), then dead-lettered.
    private func failedCall(_ error: AppleAPIError, step: DeletionStep, clientID: String, request: DeletionStore.Claimed)
        throws -> Never
    {
        if case .unavailable(let reason, let retryAfter) = error {
            try store.addStep(request.id, step: step, clientID: clientID, outcome: .retry, detail: reason)
            throw Setback(reason: reason, retryAfter: retryAfter)
        }
        try store.addStep(
            request.id, step: step, clientID: clientID, outcome: error.kind == "invalid_request" ? .requestError : .error,
            detail: "\(error)")
        throw Setback(reason: "\(error)")
    }

    /// Schedules the next attempt with exponential backoff and jitter (at least Apple's
    /// Retry-After), or dead-letters the request.
    private func settle(_ request: DeletionStore.Claimed, _ setback: Setback) {
        var delay = settings.retryBackoff.delay(after: request.attempts)
        if let retryAfter = setback.retryAfter { delay = max(delay, .seconds(retryAfter)) }
        do {
            let state = try store.reschedule(
                request, after: delay, error: setback.reason,
                maximumAttempts: settings.maximumAttempts, fail: setback.permanent)
            outcomes.increment(state == .failed ? "failed" : "retry")
            if state == .failed {
                logger.error("deletion dead-lettered", [("deletion_id", request.id.lowercasedString), ("error", setback.reason)])
            }
        } catch {
            // The lease will bring it back.
            logger.warning("could not reschedule a deletion", [("error", "\(error)")])
        }
    }
}
