import Foundation
import Testing

@testable import BrokerCore

/// The refresh sweep's breaker judges Apple's answers across tokens (issue 35; protocol
/// reference §12.2): pure decisions, no database.
@Suite("Sweep answer window")
struct SweepAnswerWindowTests {
    func window(_ answers: [(SweepAnswerWindow.Answer, UUID)], at now: ContinuousClock.Instant = .now) -> SweepAnswerWindow {
        var window = SweepAnswerWindow()
        for (answer, token) in answers { window.record(answer, token: token, at: now) }
        return window
    }

    @Test("a rising share of request errors across tokens trips it; a few among many answers do not")
    func requestErrorShare() {
        let valid = (0..<27).map { _ in (SweepAnswerWindow.Answer.valid, UUID()) }
        let errors = (0..<3).map { _ in (SweepAnswerWindow.Answer.requestError, UUID()) }
        #expect(window(Array(errors.prefix(2))).trip == nil, "two are not yet a pattern")
        #expect(window(valid + errors).trip == .requestErrors, "3 of 30: a tenth")
        #expect(window(valid + [(.valid, UUID())] + errors).trip == nil, "3 of 31")
        // Other failures (5xx, invalid_client) count as answers, not as request errors.
        #expect(window((0..<20).map { _ in (.failure, UUID()) }).trip == nil)
    }

    @Test("a burst of answers worded as a revocation trips it; a revocation now and then does not")
    func revokedBurst() {
        let valid = (0..<245).map { _ in (SweepAnswerWindow.Answer.valid, UUID()) }
        let revoked = (0..<5).map { _ in (SweepAnswerWindow.Answer.revoked, UUID()) }
        #expect(window(valid + revoked).trip == .revokedBurst, "5 of 250: a fiftieth")
        #expect(window(valid + Array(revoked.prefix(4))).trip == nil, "four people revoked")
        #expect(window(valid + [(.valid, UUID())] + revoked).trip == nil, "5 of 251")
    }

    @Test("a repeated request error is one token's own only when no other token got one and another refreshed")
    func tokenSpecific() {
        let token = UUID()
        #expect(window([(.requestError, token), (.valid, UUID()), (.requestError, token)]).requestErrorsAreOnly(token))
        #expect(!window([(.requestError, token), (.requestError, token)]).requestErrorsAreOnly(token), "nothing refreshed")
        #expect(
            !window([(.requestError, token), (.valid, UUID()), (.requestError, UUID())]).requestErrorsAreOnly(token),
            "another token's request failed too: an intermittent defect")
    }

    @Test("answers older than the span or beyond the capacity are forgotten")
    func bounded() {
        let start = ContinuousClock.now
        var window = SweepAnswerWindow()
        for _ in 0..<3 { window.record(.requestError, token: UUID(), at: start) }
        #expect(window.trip == .requestErrors)
        window.record(.valid, token: UUID(), at: start + SweepAnswerWindow.span + .seconds(1))
        #expect(window.trip == nil)
        #expect(window.count(.requestError) == 0 && window.count(.valid) == 1)
        for _ in 0..<(SweepAnswerWindow.capacity + 50) {
            window.record(.valid, token: UUID(), at: start + SweepAnswerWindow.span)
        }
        #expect(window.count(.valid) == SweepAnswerWindow.capacity)
    }
}
