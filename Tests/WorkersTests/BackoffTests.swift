import Testing
import Workers

/// A generator with a fixed seed (SplitMix64), so jittered delays are the same on every run.
struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

@Suite("Backoff")
struct BackoffTests {
    @Test("the ceiling doubles from the first delay and stops at the maximum")
    func doubling() {
        let backoff = Backoff(first: .seconds(1), maximum: .seconds(60))
        #expect((0...8).map { backoff.ceiling(after: $0) } == [1, 1, 2, 4, 8, 16, 32, 60, 60].map { Duration.seconds($0) })
    }

    @Test("any failure count is safe: no overflow, no floating point")
    func hugeCounts() {
        let backoff = Backoff(first: .milliseconds(5000), maximum: .seconds(600))
        #expect(backoff.ceiling(after: 64) == .seconds(600))
        #expect(backoff.ceiling(after: .max) == .seconds(600))
        #expect(backoff.ceiling(after: .min) == .seconds(5))
        // Exact sub-second values, as a millisecond setting gives them.
        #expect(Backoff(first: .milliseconds(300), maximum: .seconds(1)).ceiling(after: 2) == .milliseconds(600))
    }

    @Test("a first delay above the maximum gives the maximum")
    func firstAboveMaximum() {
        let backoff = Backoff(first: .seconds(3600), maximum: .seconds(600), jitter: .none)
        #expect(backoff.ceiling(after: 1) == .seconds(600))
        #expect(backoff.delay(after: 5) == .seconds(600))
    }

    @Test("jitter stays in its band, and a seeded generator repeats it exactly")
    func jitterBands() {
        var generator = SeededGenerator(state: 42)
        for failures in 1...12 {
            let ceiling = Backoff(first: .milliseconds(100), maximum: .seconds(30)).ceiling(after: failures)
            let equal = Backoff(first: .milliseconds(100), maximum: .seconds(30), jitter: .equal)
                .delay(after: failures, using: &generator)
            #expect(equal >= ceiling / 2 && equal <= ceiling)
            let full = Backoff(first: .milliseconds(100), maximum: .seconds(30), jitter: .full)
                .delay(after: failures, using: &generator)
            #expect(full >= .zero && full <= ceiling)
            let added = Backoff(first: .milliseconds(100), maximum: .seconds(30), jitter: .added(0.1))
                .delay(after: failures, using: &generator)
            #expect(added >= ceiling && added <= ceiling + ceiling / 10)
            #expect(Backoff(first: .milliseconds(100), maximum: .seconds(30), jitter: .none).delay(after: failures) == ceiling)
        }
        var first = SeededGenerator(state: 7)
        var second = SeededGenerator(state: 7)
        let backoff = Backoff(first: .seconds(1), maximum: .seconds(3600))
        let once = (1...20).map { backoff.delay(after: $0, using: &first) }
        let again = (1...20).map { backoff.delay(after: $0, using: &second) }
        #expect(once == again)
        // The jitter spreads: twenty draws of one ceiling are not all alike.
        var spread = SeededGenerator(state: 9)
        #expect(Set((0..<20).map { _ in backoff.delay(after: 10, using: &spread) }).count > 15)
    }

    @Test("the schedules the codebase uses are the ones it documents")
    func documentedSchedules() {
        // BROKER_DELETION_RETRY_BASE_MS=5000, BROKER_DELETION_RETRY_MAX_SECONDS=600 (the defaults).
        let deletion = Backoff(first: .milliseconds(5000), maximum: .seconds(600))
        #expect(
            (1...9).map { deletion.ceiling(after: $0) } == [5, 10, 20, 40, 80, 160, 320, 600, 600].map { Duration.seconds($0) })
        // Webhook and logout deliveries: 1 s doubling to an hour.
        let delivery = Backoff(first: .seconds(1), maximum: .seconds(3600))
        #expect(delivery.ceiling(after: 13) == .seconds(3600))
        #expect(delivery.ceiling(after: 12) == .seconds(2048))
    }
}
