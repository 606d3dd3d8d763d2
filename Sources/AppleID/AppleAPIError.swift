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

    /// Whether Apple's answer to a refresh or revoke says the grant itself is dead: the user
    /// revoked the app, deleted the account, or the token was revoked. Apple answers such a
    /// refresh with `invalid_grant`, and also with `invalid_request` ("The user has revoked
    /// authorization for the client", TN3107; forum thread 123909). Every other failure
    /// (`invalid_client`, 5xx, timeouts) says nothing about the token and must not revoke it.
    public var isGrantRevoked: Bool {
        switch self {
        case .invalidGrant: true
        case .rejected(_, let error): error == "invalid_request"
        default: false
        }
    }

    /// A short, bounded name for metrics and breaker decisions.
    public var kind: String {
        switch self {
        case .invalidGrant: "invalid_grant"
        case .invalidClient: "invalid_client"
        case .rejected(_, let error): error == "invalid_request" ? "invalid_request" : "rejected"
        case .unavailable: "unavailable"
        case .malformedResponse: "malformed_response"
        }
    }

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
