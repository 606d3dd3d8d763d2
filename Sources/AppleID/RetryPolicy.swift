import Foundation
import Workers

/// How many times, and how patiently, a call to Apple is retried.
public struct RetryPolicy: Sendable {
    public var maximumAttempts: Int
    public var baseDelay: Duration
    public var maximumDelay: Duration

    public init(maximumAttempts: Int = 3, baseDelay: Duration = .milliseconds(200), maximumDelay: Duration = .seconds(2)) {
        self.maximumAttempts = maximumAttempts
        self.baseDelay = baseDelay
        self.maximumDelay = maximumDelay
    }

    /// Exponential backoff with full jitter, or the server's `Retry-After` (`AppleClient` does not
    /// retry here when Apple asks for longer than `maximumDelay`: the caller gets it).
    func delay(attempt: Int, retryAfter: Int?) -> Duration {
        if let retryAfter { return min(.seconds(retryAfter), maximumDelay) }
        let cap = min(baseDelay * (1 << min(attempt - 1, 16)), maximumDelay)
        let milliseconds = Int(cap.seconds * 1000)
        return .milliseconds(Int.random(in: milliseconds / 2...max(milliseconds / 2, milliseconds)))
    }
}
