/// How long to wait before the next try after a run of failures: `first` after the first
/// failure, doubling with each further one, never above `maximum`, then spread by `jitter`
/// so that callers failing together do not retry together.
///
/// The one retry schedule of the codebase: worker loops, calls to Apple, the deletion job,
/// outbound deliveries, the refresh-token sweep, transaction retries and the LISTEN
/// connection all describe their patience as a `Backoff`.
public struct Backoff: Sendable, Hashable {
    /// How the delay is spread below (or above) the doubled ceiling.
    public enum Jitter: Sendable, Hashable {
        /// Exactly the ceiling.
        case none
        /// Uniform between half the ceiling and the ceiling: never much sooner than planned.
        case equal
        /// Uniform between zero and the ceiling: spreads a crowd furthest.
        case full
        /// The ceiling plus up to this fraction of it (0.1: up to a tenth more).
        case added(Double)
    }

    /// The ceiling after the first failure.
    public var first: Duration
    /// The largest ceiling, however many failures came before (`.added` jitter may go above it).
    public var maximum: Duration
    public var jitter: Jitter

    public init(first: Duration, maximum: Duration, jitter: Jitter = .equal) {
        self.first = first
        self.maximum = maximum
        self.jitter = jitter
    }

    /// The delay before jitter after `failures` consecutive failures (1 or less: `first`):
    /// `first` doubled `failures - 1` times, at most `maximum` (also when `first` is larger).
    /// Exact (no floating point) and safe for any count.
    public func ceiling(after failures: Int) -> Duration {
        var value = max(first, .zero)
        var doublings = failures > 1 ? failures - 1 : 0
        while doublings > 0 && value < maximum && value > .zero {
            value = value * 2
            doublings -= 1
        }
        return min(value, maximum)
    }

    /// The jittered delay after `failures` consecutive failures.
    public func delay(after failures: Int) -> Duration {
        var generator = SystemRandomNumberGenerator()
        return delay(after: failures, using: &generator)
    }

    /// The jittered delay, drawing from `generator` (a seeded one in tests).
    public func delay<Generator: RandomNumberGenerator>(after failures: Int, using generator: inout Generator) -> Duration {
        let ceiling = ceiling(after: failures)
        let nanoseconds = ceiling.wholeNanoseconds
        switch jitter {
        case .none:
            return ceiling
        case .equal:
            return .nanoseconds(nanoseconds / 2 + Int64.random(in: 0...(nanoseconds - nanoseconds / 2), using: &generator))
        case .full:
            return .nanoseconds(Int64.random(in: 0...nanoseconds, using: &generator))
        case .added(let fraction):
            let spread = Int64(Double(nanoseconds) * max(0, fraction))
            return .nanoseconds(nanoseconds + Int64.random(in: 0...spread, using: &generator))
        }
    }
}

extension Duration {
    /// The duration in whole nanoseconds (rounded down; durations here are far below 292 years).
    package var wholeNanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }

    /// The duration in whole milliseconds (rounded down).
    package var wholeMilliseconds: Int64 { wholeNanoseconds / 1_000_000 }
}
