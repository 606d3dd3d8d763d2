import AppleID
import BrokerCrypto
import Foundation
import Locking
import Observability
import PostgresClient
import Synchronization
import Workers

/// Re-validates stored refresh tokens with Apple's refresh grant, each at most once per
/// `validationInterval` (daily by default, with jitter), so a revocation is caught
/// even when Apple's `consent-revoked` notification never arrives. Apple's answer decides
/// (`AppleAPIError.refreshVerdict`, protocol reference §11):
/// - `invalid_request` worded as a revocation (TN3107) revokes the consent of that token's
///   app group, not the user's other apps, with a `consent.revoked` event;
/// - `invalid_grant` says only that this token is dead (a password change, forum thread
///   651237): the token stops being live (`token_invalid`), the consent stays, and
///   `token.invalidated` asks the app for a fresh sign-in;
/// - an unworded `invalid_request` is a request defect (TN3107): counted (`request_error`),
///   logged, backed off, nothing revoked; only when it repeats for the same token while
///   another token of the same batch refreshes fine is it taken as a revocation
///   (`revoked_repeated_invalid_request`); a systemic one trips the breaker below.
///
/// Any other failure is no verdict on the token, and Apple asks for at most one refresh a
/// day and throttles (TN3194), so nothing is hammered:
/// - each token backs off on its own: 10 minutes after the first failure, doubling, capped
///   at the validation interval (`apple_tokens.validation_failures` counts them);
/// - when `breakerThreshold` tokens in a row fail with the same error and none succeeds
///   (one wrong key setting fails every call alike: a configuration fault, not a mass
///   revocation), the breaker opens: the rest of the batch is put back untouched and no
///   token is tried for `breakerPause` (`refresh_sweep_breaker_open`).
///
/// Due tokens are claimed with `FOR UPDATE SKIP LOCKED` and leased for ten minutes, so
/// replicas and lanes share the work and a crashed worker's tokens come back on their own.
/// It runs as a `WorkerGroup` of `BROKER_SWEEP_CONCURRENCY` lanes.
package final class RefreshTokenSweep: Sendable {
    private let store: RefreshTokenStore
    private let apple: AppleClient
    private let tokenKeys: TokenKeyRing
    private let settings: BrokerConfiguration.SweepSettings
    private let groups: AppGroups
    private let logger: Logger
    private let outcomes: CounterFamily
    private let breakerTrips: CounterFamily
    private let batchSize = 10
    /// Consecutive same-error failures (and no success) that open the breaker.
    let breakerThreshold = 3
    /// Until when the breaker holds the sweep, if it is open.
    private let breaker = Breaker()

    /// The breaker's state, shared with the metrics collector.
    private final class Breaker: Sendable {
        private let openUntil = Lock<ContinuousClock.Instant?>(nil)

        var isOpen: Bool { openUntil.withLock { until in until.map { $0 > ContinuousClock.now } ?? false } }

        func open(for pause: Duration) { openUntil.withLock { $0 = ContinuousClock.now + pause } }
    }

    package init(
        pool: PostgresPool, apple: AppleClient, tokenKeys: TokenKeyRing, settings: BrokerConfiguration.SweepSettings,
        groups: AppGroups, teamID: String, metrics: MetricsRegistry, logger: Logger
    ) {
        store = RefreshTokenStore(pool: pool, teamID: teamID)
        self.apple = apple
        self.tokenKeys = tokenKeys
        self.settings = settings
        self.groups = groups
        self.logger = logger
        outcomes = metrics.counter(
            "refresh_token_validations_total", help: "Refresh-token re-validations by outcome.", labels: ["outcome"])
        breakerTrips = metrics.counter(
            "refresh_sweep_breaker_trips_total",
            help: "Times the refresh sweep stopped because one non-verdict error (e.g. invalid_client) failed a run of tokens.",
            labels: ["error"])
        metrics.collect { [breaker] in
            [
                CollectedSample(
                    name: "refresh_sweep_breaker_open",
                    help: "1 while the refresh sweep is paused by its breaker (a configuration fault at Apple's end).",
                    value: breaker.isOpen ? 1 : 0)
            ]
        }
    }

    typealias DueToken = RefreshTokenStore.DueToken

    /// What one validation came to.
    enum Verdict: Equatable {
        case valid
        case revoked
        /// Apple called the token dead (`invalid_grant`); the consent stays.
        case tokenInvalid
        /// No verdict on the token; `kind` names the error (bounded).
        case failed(kind: String)
        /// An unworded `invalid_request` that this token also got last time.
        case repeatedRequestError
    }

    /// Whether the breaker holds the sweep now.
    var breakerIsOpen: Bool { breaker.isOpen }

    /// One batch: claims due tokens and validates them; true when the batch was full.
    package func step() throws -> Bool {
        guard !breakerIsOpen else { return false }
        let due = try store.claimDue(limit: batchSize)
        guard !due.isEmpty else { return false }
        var run: (kind: String, count: Int)?
        var anyVerdict = false
        var anyValid = false
        var repeated: [DueToken] = []
        for (index, token) in due.enumerated() {
            let verdict = validate(token)
            switch verdict {
            case .valid, .revoked, .tokenInvalid:
                anyVerdict = true
                anyValid = anyValid || verdict == .valid
                run = nil
            case .failed(let kind):
                run = run?.kind == kind ? (kind, run!.count + 1) : (kind, 1)
            case .repeatedRequestError:
                repeated.append(token)
                run = run?.kind == "invalid_request" ? ("invalid_request", run!.count + 1) : ("invalid_request", 1)
            }
            if !anyVerdict, let run, run.count >= breakerThreshold {
                openBreaker(kind: run.kind, untouched: due[(index + 1)...].map(\.id))
                return false
            }
        }
        // TN3107's second signal (protocol reference §11.1): the same token's request was
        // "invalid" twice while another token's identical request went through, so the
        // defect is this grant's, not ours. Without such a success nothing is concluded.
        if anyValid {
            for token in repeated {
                revokeConsent(token, outcome: "revoked_repeated_invalid_request", appleError: "invalid_request")
            }
        } else if !repeated.isEmpty {
            outcomes.increment("request_error_unconfirmed", by: Double(repeated.count))
        }
        return due.count == batchSize
    }

    /// Pauses the sweep and puts the batch's untried tokens back as they were due.
    private func openBreaker(kind: String, untouched: [UUID]) {
        let pause = settings.breakerPause
        breaker.open(for: pause)
        breakerTrips.increment(kind)
        logger.error(
            "refresh sweep paused: every call failed alike, which is a fault of ours or Apple's, not a verdict on the tokens",
            [("error", kind), ("pause_seconds", String(pause.components.seconds))])
        try? store.release(untouched)
    }

    /// When a token is tried again after consecutive failures: 10 minutes doubling, at most
    /// the validation interval, plus up to a tenth as jitter.
    static func backoff(validationInterval: Duration) -> Backoff {
        Backoff(first: .seconds(600), maximum: validationInterval, jitter: .added(0.1))
    }

    /// When a valid token is validated again: the interval plus up to a tenth, so tokens
    /// stored together spread out.
    static func nextValidation(after interval: Duration) -> Duration {
        Backoff(first: interval, maximum: interval, jitter: .added(0.1)).delay(after: 1)
    }

    private func validate(_ token: DueToken) -> Verdict {
        let refreshToken: String
        do {
            refreshToken = try SealedAppleToken(.refresh, sealed: token.sealed, keyID: token.keyID).open(
                for: .init(teamID: token.teamID, sub: token.sub, clientID: token.clientID), keys: tokenKeys)
        } catch {
            outcomes.increment("undecryptable")
            logger.error("a stored refresh token cannot be decrypted", [("token_id", token.id.lowercasedString)])
            recordFailure(token, kind: "undecryptable")
            return .failed(kind: "undecryptable")
        }
        do {
            _ = try apple.refresh(refreshToken, clientID: token.clientID, retry: RetryPolicy(maximumAttempts: 2))
            try store.recordValid(token.id, next: Self.nextValidation(after: settings.validationInterval))
            outcomes.increment("valid")
            return .valid
        } catch let error as AppleAPIError where error.refreshVerdict == .revoked {
            revokeConsent(token, outcome: "revoked", appleError: error.kind)
            return .revoked
        } catch let error as AppleAPIError where error.refreshVerdict == .tokenInvalid {
            // invalid_grant: this token is dead, the user's authorization may well stay
            // (a password change; forum thread 651237, protocol reference §11.3).
            let group = groups.group(of: token.clientID)
            do {
                try store.invalidateToken(token.id, group: group, appleError: error.kind)
                outcomes.increment("token_invalid")
                logger.info(
                    "refresh token dead (invalid_grant): consent kept, a fresh sign-in is needed to store a new token",
                    [("identity_id", token.identityID.lowercasedString), ("client_id", group.primary)])
            } catch {
                outcomes.increment("error")
            }
            return .tokenInvalid
        } catch let error as AppleAPIError where error.refreshVerdict == .requestError {
            // A request defect (TN3107), not a verdict: alert, back off, revoke nothing.
            outcomes.increment("request_error")
            logger.error(
                "Apple answered invalid_request to a refresh without saying the user revoked: a request defect (proxy, content type, parameters)",
                [("token_id", token.id.lowercasedString), ("apple_error", "\(error)")])
            recordFailure(token, kind: error.kind)
            return token.lastError == error.kind ? .repeatedRequestError : .failed(kind: error.kind)
        } catch {
            // Apple unavailable or refusing our client: no verdict on the token. Back off.
            let kind = (error as? AppleAPIError)?.kind ?? "error"
            outcomes.increment("error")
            logger.warning("refresh-token validation failed", [("error", kind)])
            recordFailure(token, kind: kind)
            return .failed(kind: kind)
        }
    }

    /// Revokes the consent of the token's app group (`consent.revoked`, source `refresh_sweep`).
    private func revokeConsent(_ token: DueToken, outcome: String, appleError: String) {
        let group = groups.group(of: token.clientID)
        do {
            try store.revokeConsent(identityID: token.identityID, group: group)
            outcomes.increment(outcome)
            logger.info(
                "Apple says the user revoked the app: the app group's consent is revoked",
                [("identity_id", token.identityID.lowercasedString), ("client_id", group.primary), ("apple_error", appleError)])
        } catch {
            outcomes.increment("error")
        }
    }

    /// One more consecutive failure: the token is next tried after its backoff (jittered).
    private func recordFailure(_ token: DueToken, kind: String) {
        let failures = token.failures + 1
        let delay = Self.backoff(validationInterval: settings.validationInterval).delay(after: failures)
        try? store.backOff(token.id, failures: failures, kind: kind, delay: delay)
    }
}
