import Foundation

/// What Apple answered the refresh sweep lately, across tokens: the memory of the sweep's
/// breaker (protocol reference §12.2). Apple's answers are verdicts on single authorizations,
/// but a defect of ours or of a proxy in between answers many tokens alike, and an
/// intermittent one (one of two egress proxies rewriting bodies, a WAF rule, an edge rollout)
/// fails random tokens while others pass. So the answers are judged together before any
/// verdict is applied:
/// - a rising share of unworded `invalid_request` across tokens (at least
///   `requestErrorMinimum`, and `requestErrorShare` of the answers) pauses every verdict;
/// - so does a burst of answers worded as a revocation (at least `revokedMinimum`, and
///   `revokedShare` of the answers): people do not revoke the app together, a canned answer
///   does;
/// - an unworded `invalid_request` repeated on one token counts against that token only when
///   no other token got one in the window and some token refreshed fine.
///
/// Pure: the sweep keeps one per process (replicas judge what they see). Bounded:
/// `capacity` answers of the last `span`.
struct SweepAnswerWindow: Sendable {
    /// One answer's kind.
    enum Answer: Sendable, Equatable {
        case valid
        /// `invalid_request` worded as a revocation.
        case revoked
        /// `invalid_grant`.
        case tokenInvalid
        /// `invalid_request` without a revocation's wording.
        case requestError
        /// No verdict (`invalid_client`, 5xx, timeouts, undecryptable).
        case failure
    }

    /// Why the window pauses every verdict; the raw value is the breaker-trip metric's label.
    enum Trip: String, Sendable, Equatable {
        case requestErrors = "request_error_share"
        case revokedBurst = "revoked_burst"
    }

    static let span: Duration = .seconds(3600)
    static let capacity = 1000
    static let requestErrorMinimum = 3
    static let requestErrorShare = 0.1
    static let revokedMinimum = 5
    static let revokedShare = 0.02

    private struct Entry {
        var at: ContinuousClock.Instant
        var token: UUID
        var answer: Answer
    }

    private var entries: [Entry] = []

    /// Adds one answer about `token`, forgetting what is older than `span` or beyond `capacity`.
    mutating func record(_ answer: Answer, token: UUID, at now: ContinuousClock.Instant = .now) {
        entries.append(Entry(at: now, token: token, answer: answer))
        let oldest = now - Self.span
        if let keep = entries.firstIndex(where: { $0.at >= oldest }) {
            entries.removeFirst(max(keep, entries.count - Self.capacity))
        } else {
            entries.removeAll()
        }
    }

    func count(_ answer: Answer) -> Int { entries.reduce(0) { $0 + ($1.answer == answer ? 1 : 0) } }

    /// Whether the answers in the window pause every verdict, and why.
    var trip: Trip? {
        let total = Double(entries.count)
        let requestErrors = count(.requestError)
        if requestErrors >= Self.requestErrorMinimum, Double(requestErrors) >= Self.requestErrorShare * total {
            return .requestErrors
        }
        let revoked = count(.revoked)
        if revoked >= Self.revokedMinimum, Double(revoked) >= Self.revokedShare * total { return .revokedBurst }
        return nil
    }

    /// Whether an unworded `invalid_request` repeated on `token` is that token's own problem:
    /// no other token got one in the window, and some token refreshed fine.
    func requestErrorsAreOnly(_ token: UUID) -> Bool {
        !entries.contains { $0.answer == .requestError && $0.token != token } && entries.contains { $0.answer == .valid }
    }
}
