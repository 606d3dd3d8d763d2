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
/// - **Revoke**: each of the user's refresh tokens at Apple's `/auth/revoke` with the client
///   id it was issued to; 200 counts as revoked, `invalid_grant` as already invalid, and
///   `invalid_request` is a request error (TN3107), never success; 5xx, 429 (honouring
///   `Retry-After`) and timeouts are retried with exponential backoff and jitter. Every call's
///   outcome is a step of the request. Apple-initiated deletions skip this (the tokens are
///   already dead). A fresh authorization code handed over with the request is exchanged
///   first, normally in the API request itself (`HandedOverCode`), and what it yields is revoked
///   too; the access token of a code exchange is revoked while it is valid. With no token
///   and no code the deletion still completes, as `manual_required`: Apple keeps the app
///   under the user's Sign in with Apple apps until they stop using it in Settings (TN3194).
///   What it came to is the request's `apple_revocation`, also in `user.deleted`.
/// - **Purge**: one transaction (`broker_purge_user`): tombstones, the user row with
///   everything personal cascading away, `user.deleted`, an audit record.
///
/// Requests are claimed with `FOR UPDATE SKIP LOCKED` and leased; a worker killed at any
/// point leaves its requests to the next one, which resumes where the steps say, and the
/// purge runs once (it requires the `purging` state and ends it).
package final class DeletionJob: Sendable {
    let store: DeletionStore
    let apple: AppleClient
    let tokenKeys: TokenKeyRing
    let settings: BrokerConfiguration.DeletionSettings
    /// Verifies the `id_token` of a handed-over code's exchange.
    let validator: IdentityTokenValidator
    let logger: Logger
    private let outcomes: CounterFamily
    private let revocations: CounterFamily

    package init(
        store: DeletionStore, apple: AppleClient, tokenKeys: TokenKeyRing, settings: BrokerConfiguration.DeletionSettings,
        validator: IdentityTokenValidator, metrics: MetricsRegistry, logger: Logger
    ) {
        self.store = store
        self.apple = apple
        self.tokenKeys = tokenKeys
        self.settings = settings
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
                try revokeTokens(request)
                let appleRevocation = try store.appleRevocation(request.id, source: request.source)
                try store.startPurging(request.id, appleRevocation: appleRevocation)
                revocations.increment(appleRevocation.rawValue)
            }
            if try store.purge(request.id) {
                outcomes.increment("done")
                logger.info("user purged", [("deletion_id", request.id.lowercasedString)])
            }
        } catch let setback as Setback {
            settle(request, setback)
        } catch {
            settle(request, Setback(reason: "\(error)"))
        }
    }

    private func revokeTokens(_ request: DeletionStore.Claimed) throws {
        if request.source == .apple {
            if try !store.hasSteps(request.id, named: .revokeSkipped) {
                try store.addStep(
                    request.id, step: .revokeSkipped, outcome: .skipped,
                    detail: "Apple deleted the account: its tokens are already invalid")
            }
            return
        }
        // Usually done already, in the API request (HandedOverCode).
        try HandedOverCode(store: store, apple: apple, tokenKeys: tokenKeys, validator: validator)
            .exchange(deletionID: request.id, userID: request.userID)
        let tokens = try store.liveTokens(of: request.userID)
        if tokens.isEmpty {
            if try !store.hasSteps(request.id, named: .revoke), try !store.hasSteps(request.id, named: .nothingToRevoke) {
                try store.addStep(
                    request.id, step: .nothingToRevoke, outcome: .manualRevocationRequired,
                    detail:
                        "no refresh token on file and no authorization code: the user must stop using Sign in with Apple for this app in Settings"
                )
            }
            return
        }
        for token in tokens {
            // Each success is marked in the step's transaction: a retry does only what is left.
            let owner = SealedAppleToken.Owner(teamID: token.teamID, sub: token.sub, clientID: token.clientID)
            if !token.refreshRevoked {
                let refreshToken = try open(
                    SealedAppleToken(.refresh, sealed: token.sealed, keyID: token.keyID), for: owner, request: request)
                try revoke(
                    refreshToken, hint: "refresh_token", step: .revoke, token: token.id, clientID: token.clientID,
                    request: request)
            }
            if let access = token.access {
                let accessToken = try open(
                    SealedAppleToken(.access, sealed: access.sealed, keyID: access.keyID), for: owner, request: request)
                try revoke(
                    accessToken, hint: "access_token", step: .revokeAccessToken, accessTokenOf: token.id,
                    clientID: token.clientID, request: request)
            }
        }
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

    /// One revoke call and its step. Apple answers 200 for a revoked or already invalid token
    /// (protocol reference §10.3), so `invalid_grant` counts as `already_invalid`; but
    /// `invalid_request` there is always a defect of the request (TN3107, §11.2) and the grant
    /// may be live: an error of the step, retried and then dead-lettered, like any other
    /// refusal. Apple unavailable is retried later, after at least its `Retry-After`.
    private func revoke(
        _ token: String, hint: String, step: DeletionStep, token tokenID: UUID? = nil, accessTokenOf: UUID? = nil,
        clientID: String,
        request: DeletionStore.Claimed
    ) throws {
        do {
            try apple.revoke(token, clientID: clientID, hint: hint, retry: RetryPolicy(maximumAttempts: 3))
            try store.addStep(
                request.id, step: step, clientID: clientID, outcome: .revoked, tokenID: tokenID, accessTokenOf: accessTokenOf)
        } catch AppleAPIError.invalidGrant {
            try store.addStep(
                request.id, step: step, clientID: clientID, outcome: .alreadyInvalid, tokenID: tokenID,
                accessTokenOf: accessTokenOf)
        } catch AppleAPIError.unavailable(let reason, let retryAfter) {
            try store.addStep(request.id, step: step, clientID: clientID, outcome: .retry, detail: reason)
            throw Setback(reason: reason, retryAfter: retryAfter)
        } catch let error as AppleAPIError {
            try store.addStep(
                request.id, step: step, clientID: clientID, outcome: error.kind == "invalid_request" ? .requestError : .error,
                detail: "\(error)")
            throw Setback(reason: "\(error)")
        }
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
