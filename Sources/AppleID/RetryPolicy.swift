import Foundation
import Workers

/// How many times, and how patiently, a call to Apple is retried.
public struct RetryPolicy: Sendable {
    public var maximumAttempts: Int
    /// Between tries: 200 ms doubling up to 2 s, each between half and all of that.
    public var backoff: Backoff

    public init(maximumAttempts: Int = 3, backoff: Backoff = Backoff(first: .milliseconds(200), maximum: .seconds(2))) {
        self.maximumAttempts = maximumAttempts
        self.backoff = backoff
    }

    /// The longest wait between tries (`AppleClient` does not retry when Apple's `Retry-After`
    /// asks for longer: the caller gets the answer).
    public var maximumDelay: Duration { backoff.maximum }

    /// The backoff after the `attempt`-th try, or the server's `Retry-After` (at most `maximumDelay`).
    func delay(attempt: Int, retryAfter: Int?) -> Duration {
        if let retryAfter { return min(.seconds(retryAfter), maximumDelay) }
        return backoff.delay(after: attempt)
    }
}
