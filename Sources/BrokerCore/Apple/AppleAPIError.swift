import HTTPClient

/// How a call to Apple failed.
public enum AppleAPIError: Error, Sendable, CustomStringConvertible {
    /// `invalid_grant`: the code or refresh token is expired, used, revoked or for another client.
    case invalidGrant(String?)
    /// `invalid_client`: Apple refused our client secret (key, key id, team id or client id wrong).
    case invalidClient
    /// Another 4xx answer from Apple, with its `error` value.
    case rejected(status: Int, error: String?)
    /// Apple could not be reached or kept failing (5xx, 429, timeouts) after the retries;
    /// `retryAfter` is the last `Retry-After` Apple sent, in seconds.
    case unavailable(String, retryAfter: Int? = nil)
    /// Apple answered something this client cannot read.
    case malformedResponse(String)

    public var description: String {
        switch self {
        case .invalidGrant(let detail): "invalid_grant\(detail.map { ": \($0)" } ?? "")"
        case .invalidClient: "invalid_client"
        case .rejected(let status, let error): "rejected with \(status) \(error ?? "")"
        case .unavailable(let reason, _): "unavailable: \(reason)"
        case .malformedResponse(let reason): "malformed response: \(reason)"
        }
    }
}
