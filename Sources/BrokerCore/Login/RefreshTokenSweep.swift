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
/// even when Apple's `consent-revoked` notification never arrives. Apple's answer is a
/// verdict on the authorization the token came from (`AppleAPIError.refreshVerdict`,
/// protocol reference §11, §12), applied by sql `broker_sweep_verdict`:
/// - `invalid_request` worded as a revocation (TN3107) revokes the consent of that token's app
///   group as of the last time Apple vouched for the token, with `consent.revoked`; when the
///   user has signed in to the group since, that sign-in proves the authorization now and
///   only this token ends (`superseded`, `token.invalidated`);
/// - `invalid_grant` says only that this token is dead (a password change, forum thread
///   651237): the token stops being live (`token_invalid`), the consent stays, and
///   `token.invalidated` asks the app for a fresh sign-in;
/// - an unworded `invalid_request` is a request defect (TN3107), never a verdict on consent:
///   counted (`request_error`), logged, backed off; repeated on one token while no other token
///   gets one and others refresh fine, it marks that token `token_invalid` at most (§12.2).
///
/// Verdicts are applied only after the batch's answers are judged together with the recent
/// ones (`SweepAnswerWindow`): a rising share of request errors, or a burst of answers worded
/// as a revocation, pauses every verdict (the batch's verdicts are put back, outcome
/// `verdict_paused`) and opens the breaker. Any other failure is no verdict on the token, and
/// Apple asks for at most one refresh a day and throttles (TN3194), so nothing is hammered:
/// - each token backs off on its own: 10 minutes after the first failure, doubling, capped
///   at the validation interval (`apple_tokens.validation_failures` counts them);
/// - when `breakerThreshold` tokens in a row fail with the same error and none succeeds
///   (one wrong key setting fails every call alike: a configuration fault, not a mass
///   revocation), the breaker opens at once and the rest of the batch is put back untouched.
/// An open breaker holds the sweep for `breakerPause` (`refresh_sweep_breaker_open`).
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
    /// Until when the breaker holds the sweep, if it is open, and what Apple answered lately.
    private let breaker = Breaker()

    /// The breaker's state, shared by the lanes and with the metrics collector.
    private final class Breaker: Sendable {
        private let openUntil = Lock<ContinuousClock.Instant?>(nil)
        /// Apple's recent answers across tokens (every lane's).
        let window = Lock(SweepAnswerWindow())

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
            help:
                "Times the refresh sweep paused: one non-verdict error (e.g. invalid_client) failed a run of tokens, or Apple's answers across tokens were a rising share of request errors (request_error_share) or a burst of revocations (revoked_burst).",
            labels: ["error"])
        metrics.collect { [breaker] in
            [
                CollectedSample(
                    name: "refresh_sweep_breaker_open",
                    help: "1 while the refresh sweep is paused by its breaker (a fault of ours, or between us and Apple).",
                    value: breaker.isOpen ? 1 : 0)
            ]
        }
    }

    typealias DueToken = RefreshTokenStore.DueToken

    /// What one validation came to.
    enum Verdict: Equatable {
        case valid
        /// Apple's words: the user revoked the app.
        case revoked
        /// Apple called the token dead (`invalid_grant`); the consent stays.
        case tokenInvalid
        /// No verdict on the token; `kind` names the error (bounded).
        case failed(kind: String)
        /// An unworded `invalid_request`; `repeated` when this token also got one last time.
        case requestError(repeated: Bool)

        /// How the breaker's window counts it.
        var answer: SweepAnswerWindow.Answer {
            switch self {
            case .valid: .valid
            case .revoked: .revoked
            case .tokenInvalid: .tokenInvalid
            case .failed: .failure
            case .requestError: .requestError
            }
        }

        /// Whether applying it changes something (a token ends, or a consent).
        var isVerdict: Bool {
            switch self {
            case .revoked, .tokenInvalid, .requestError(repeated: true): true
            default: false
            }
        }
    }

    /// Whether the breaker holds the sweep now.
    var breakerIsOpen: Bool { breaker.isOpen }

    /// One batch: claims due tokens, asks Apple about each, judges the answers together and
    /// only then applies the verdicts; true when the batch was full.
    package func step() throws -> Bool {
        guard !breakerIsOpen else { return false }
        let due = try store.claimDue(limit: batchSize)
        guard !due.isEmpty else { return false }
        var run: (kind: String, count: Int)?
        var anyAnswer = false
        var answered: [(token: DueToken, verdict: Verdict)] = []
        for (index, token) in due.enumerated() {
            let verdict = validate(token)
            answered.append((token, verdict))
            switch verdict {
            case .valid, .revoked, .tokenInvalid:
                anyAnswer = true
                run = nil
            case .failed(let kind):
                run = run?.kind == kind ? (kind, run!.count + 1) : (kind, 1)
            case .requestError:
                run = run?.kind == "invalid_request" ? ("invalid_request", run!.count + 1) : ("invalid_request", 1)
            }
            if !anyAnswer, let run, run.count >= breakerThreshold {
                remember(answered)
                openBreaker(kind: run.kind, untouched: due[(index + 1)...].map(\.id))
                return false
            }
        }
        let (trip, window) = remember(answered)
        let verdicts = answered.filter(\.verdict.isVerdict)
        if let trip {
            // Apple's answers across tokens say the fault is ours or in between: no verdict
            // now (§12.2); these tokens are tried again once the pause is over.
            outcomes.increment("verdict_paused", by: Double(verdicts.count))
            openBreaker(kind: trip.rawValue, untouched: verdicts.map(\.token.id))
            return false
        }
        for (token, verdict) in verdicts {
            switch verdict {
            case .revoked:
                apply(token, .revoked, appleError: "invalid_request")
            case .tokenInvalid:
                apply(token, .tokenInvalid, appleError: "invalid_grant")
            default:
                // The same token's request was "invalid" twice while no other token's was and
                // others refreshed: at most this token is dead (§12.2), never the consent.
                if window.requestErrorsAreOnly(token.id) {
                    apply(token, .tokenInvalid, appleError: "invalid_request", outcome: "token_invalid_repeated_request_error")
                } else {
                    outcomes.increment("request_error_unconfirmed")
                }
            }
        }
        return due.count == batchSize
    }

    /// Adds the answers to the breaker's window; what it says now.
    @discardableResult
    private func remember(_ answered: [(token: DueToken, verdict: Verdict)]) -> (SweepAnswerWindow.Trip?, SweepAnswerWindow) {
        breaker.window.withLock { window in
            for (token, verdict) in answered { window.record(verdict.answer, token: token.id) }
            return (window.trip, window)
        }
    }

    /// Pauses the sweep and puts tokens back as they were due: the batch's untried ones, or
    /// those whose verdicts were not applied.
    private func openBreaker(kind: String, untouched: [UUID]) {
        let pause = settings.breakerPause
        breaker.open(for: pause)
        breakerTrips.increment(kind)
        logger.error(
            "refresh sweep paused: Apple's answers across tokens point to a fault of ours or in between, not verdicts on the tokens",
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

    /// Asks Apple about one token. A valid token and a failure are recorded at once; a verdict
    /// is returned to be judged with the batch.
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
            return .revoked
        } catch let error as AppleAPIError where error.refreshVerdict == .tokenInvalid {
            // invalid_grant: this token is dead, the user's authorization may well stay
            // (a password change; forum thread 651237, protocol reference §11.3).
            return .tokenInvalid
        } catch let error as AppleAPIError where error.refreshVerdict == .requestError {
            // A request defect (TN3107), not a verdict: alert, back off, revoke nothing.
            outcomes.increment("request_error")
            logger.error(
                "Apple answered invalid_request to a refresh without saying the user revoked: a request defect (proxy, content type, parameters)",
                [("token_id", token.id.lowercasedString), ("apple_error", "\(error)")])
            recordFailure(token, kind: error.kind)
            return .requestError(repeated: token.lastError == error.kind)
        } catch {
            // Apple unavailable or refusing our client: no verdict on the token. Back off.
            let kind = (error as? AppleAPIError)?.kind ?? "error"
            outcomes.increment("error")
            logger.warning("refresh-token validation failed", [("error", kind)])
            recordFailure(token, kind: kind)
            return .failed(kind: kind)
        }
    }

    /// Applies a verdict on the authorization `token` came from (sql `broker_sweep_verdict`):
    /// `revoked` revokes the group's consent unless a later sign-in superseded the token's
    /// authorization, `tokenInvalid` ends the token only.
    private func apply(_ token: DueToken, _ verdict: RefreshTokenStore.Verdict, appleError: String, outcome: String? = nil) {
        let group = groups.group(of: token.clientID)
        let fields = [
            ("identity_id", token.identityID.lowercasedString), ("client_id", group.primary), ("apple_error", appleError),
        ]
        do {
            switch try store.apply(verdict, to: token, group: group, appleError: appleError) {
            case .revoked, .alreadyRevoked:
                outcomes.increment(outcome ?? "revoked")
                logger.info("Apple says the user revoked the app: the app group's consent is revoked", fields)
            case .superseded:
                outcomes.increment("superseded")
                logger.info(
                    "Apple says this token's authorization ended, and the user signed in again since: only this token ends",
                    fields)
            case .tokenInvalid:
                outcomes.increment(outcome ?? "token_invalid")
                logger.info("refresh token dead: consent kept, a fresh sign-in is needed to store a new token", fields)
            case .gone:
                // A login replaced the token meanwhile: the verdict was about one no longer stored.
                outcomes.increment("gone")
            }
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
