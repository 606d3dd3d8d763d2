import BrokerCrypto
import Foundation
import Observability
import PostgresClient

/// The account-deletion job: works through deletion requests (from the compliance API,
/// the CLI and Apple's `account-delete`), state `requested → revoking → purging → done`,
/// or `failed` after `maximumAttempts`.
///
/// - **Revoke**: each of the user's refresh tokens at Apple's `/auth/revoke` with the client
///   id it was issued to; 200 and a dead grant (`invalid_grant`, `invalid_request`) both count
///   as revoked; 5xx, 429 (honouring
///   `Retry-After`) and timeouts are retried with exponential backoff and jitter. Every call's
///   outcome is a step of the request. Apple-initiated deletions skip this (the tokens are
///   already dead); a user with no token is recorded as "nothing to revoke".
/// - **Purge**: one transaction (`broker_purge_user`): tombstones, the user row with
///   everything personal cascading away, `user.deleted`, an audit record.
///
/// Requests are claimed with `FOR UPDATE SKIP LOCKED` and leased; a worker killed at any
/// point leaves its requests to the next one, which resumes where the steps say, and the
/// purge runs once (it requires the `purging` state and ends it).
final class DeletionJob: Sendable {
    let store: DeletionStore
    let apple: AppleClient
    let tokenKeys: TokenKeyRing
    let settings: BrokerConfiguration.DeletionSettings
    let logger: Logger
    private let outcomes: CounterFamily

    init(
        store: DeletionStore, apple: AppleClient, tokenKeys: TokenKeyRing, settings: BrokerConfiguration.DeletionSettings,
        metrics: MetricsRegistry, logger: Logger
    ) {
        self.store = store
        self.apple = apple
        self.tokenKeys = tokenKeys
        self.settings = settings
        self.logger = logger
        outcomes = metrics.counter(
            "deletions_total", help: "Deletion attempts by outcome: done, retry, failed.", labels: ["outcome"])
        let pool = store.pool
        metrics.collect {
            guard let row = try? pool.query(
                """
                SELECT count(*) FILTER (WHERE state IN ('requested', 'revoking', 'purging')),
                       count(*) FILTER (WHERE state = 'failed'),
                       COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE state IN ('requested', 'revoking', 'purging'))), 0)
                FROM deletion_requests
                """
            ).first else { return [] }
            return [
                CollectedSample(
                    name: "deletion_backlog", help: "Deletion requests not yet done.", value: (try? row.decode(Double.self, 0)) ?? 0),
                CollectedSample(
                    name: "deletion_dead_letters", help: "Deletion requests that failed and wait for a retry.",
                    value: (try? row.decode(Double.self, 1)) ?? 0),
                CollectedSample(
                    name: "deletion_oldest_pending_age_seconds", help: "Age of the oldest pending deletion request.",
                    value: (try? row.decode(Double.self, 2)) ?? 0),
            ]
        }
    }

    /// One request: claims it and works on it on the calling lane's thread. The job runs as
    /// a `WorkerGroup` of `concurrency` lanes, so that many revokes can wait on Apple at once.
    func step() throws -> Bool {
        guard let request = try store.claim(limit: 1, leaseSeconds: settings.leaseSeconds).first else { return false }
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
            if request.state == "revoking" {
                try revokeTokens(request)
                try store.startPurging(request.id)
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
        if request.source == "apple" {
            if try !store.hasSteps(request.id, named: "revoke_skipped") {
                try store.addStep(
                    request.id, step: "revoke_skipped", outcome: "skipped",
                    detail: "Apple deleted the account: its tokens are already invalid")
            }
            return
        }
        let tokens = try store.liveTokens(of: request.userID)
        if tokens.isEmpty {
            if try !store.hasSteps(request.id, named: "revoke"), try !store.hasSteps(request.id, named: "nothing_to_revoke") {
                try store.addStep(request.id, step: "nothing_to_revoke", outcome: "skipped", detail: "no refresh token on file")
            }
            return
        }
        for token in tokens {
            let refreshToken: String
            do {
                refreshToken = String(
                    decoding: try tokenKeys.open(
                        token.sealed, keyID: token.keyID,
                        associatedData: RefreshTokenSealing.associatedData(teamID: token.teamID, sub: token.sub, clientID: token.clientID)),
                    as: UTF8.self)
            } catch {
                try store.addStep(request.id, step: "revoke", clientID: token.clientID, outcome: "undecryptable", detail: "\(error)")
                throw Setback(reason: "a refresh token cannot be decrypted (TOKEN_ENCRYPTION_KEY)", permanent: true)
            }
            do {
                try apple.revoke(refreshToken, clientID: token.clientID, retry: RetryPolicy(maximumAttempts: 3))
                try store.addStep(request.id, step: "revoke", clientID: token.clientID, outcome: "revoked", tokenID: token.id)
            } catch let error as AppleAPIError where error.isGrantRevoked {
                // invalid_grant or invalid_request: the grant is already dead at Apple.
                try store.addStep(request.id, step: "revoke", clientID: token.clientID, outcome: "already_invalid", tokenID: token.id)
            } catch AppleAPIError.unavailable(let reason, let retryAfter) {
                try store.addStep(request.id, step: "revoke", clientID: token.clientID, outcome: "retry", detail: reason)
                throw Setback(reason: reason, retryAfter: retryAfter)
            } catch let error as AppleAPIError {
                try store.addStep(request.id, step: "revoke", clientID: token.clientID, outcome: "error", detail: "\(error)")
                throw Setback(reason: "\(error)")
            }
        }
    }

    /// Schedules the next attempt with exponential backoff and jitter (at least Apple's
    /// Retry-After), or dead-letters the request.
    private func settle(_ request: DeletionStore.Claimed, _ setback: Setback) {
        let exponent = min(request.attempts - 1, 20)
        let cap = min(Double(settings.retryBaseMilliseconds) * pow(2, Double(exponent)), Double(settings.retryMaximumSeconds) * 1000)
        var milliseconds = Double.random(in: cap / 2...max(cap / 2, cap))
        if let retryAfter = setback.retryAfter { milliseconds = max(milliseconds, Double(retryAfter) * 1000) }
        do {
            let state = try store.reschedule(
                request, after: .milliseconds(Int(milliseconds)), error: setback.reason,
                maximumAttempts: settings.maximumAttempts, fail: setback.permanent)
            outcomes.increment(state == "failed" ? "failed" : "retry")
            if state == "failed" {
                logger.error("deletion dead-lettered", [("deletion_id", request.id.lowercasedString), ("error", setback.reason)])
            }
        } catch {
            // The lease will bring it back.
            logger.warning("could not reschedule a deletion", [("error", "\(error)")])
        }
    }
}
