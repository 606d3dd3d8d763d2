import HTTPClient

/// How a call to Apple failed.
public enum AppleAPIError: Error, Sendable, CustomStringConvertible {
    /// `invalid_grant`: the code or refresh token is expired, used, revoked or for another client.
    case invalidGrant(String?)
    /// `invalid_client`: Apple refused our client secret (key, key id, team id or client id wrong).
    case invalidClient
    /// Another 4xx answer from Apple, with its `error` and `error_description`.
    case rejected(status: Int, error: String?, description: String? = nil)
    /// Apple could not be reached or kept failing (5xx, 429, timeouts) after the retries;
    /// `retryAfter` is the last `Retry-After` Apple sent, in seconds.
    case unavailable(String, retryAfter: Int? = nil)
    /// Apple answered something this client cannot read.
    case malformedResponse(String)

    /// What an answer to the refresh-token grant says about the user's grant (protocol
    /// reference §11; TN3107 lists the errors, TN3194 the daily validation).
    public enum RefreshVerdict: String, Sendable {
        /// The user revoked the app: `invalid_request` worded as a revocation (TN3107 "The user
        /// has revoked authorization for the client"; forum thread 123909).
        case revoked
        /// `invalid_grant`: this refresh token is dead, which a password change also does while
        /// the user's authorization stays (forum thread 651237): not a revoked consent.
        case tokenInvalid = "token_invalid"
        /// `invalid_request` without a revocation's wording: TN3107 lists request defects (content
        /// type, a missing or malformed parameter, a body a proxy rewrote) under the same code.
        case requestError = "request_error"
        /// Anything else (`invalid_client`, 5xx, timeouts): nothing about the token.
        case noVerdict = "no_verdict"
    }

    /// This answer's verdict on a refresh. Only Apple's own wording makes `invalid_request` a
    /// revocation; Apple's exact text is unconfirmed, so any description naming a revoked
    /// authorization counts.
    public var refreshVerdict: RefreshVerdict {
        switch self {
        case .invalidGrant: return .tokenInvalid
        case .rejected(_, "invalid_request", let description):
            let text = description?.lowercased() ?? ""
            let revoked = text.contains("revoked") && (text.contains("authoriz") || text.contains("consent"))
            return revoked ? .revoked : .requestError
        default: return .noVerdict
        }
    }

    /// A short, bounded name for metrics and breaker decisions.
    public var kind: String {
        switch self {
        case .invalidGrant: "invalid_grant"
        case .invalidClient: "invalid_client"
        case .rejected(_, let error, _): error == "invalid_request" ? "invalid_request" : "rejected"
        case .unavailable: "unavailable"
        case .malformedResponse: "malformed_response"
        }
    }

    /// Apple answered 429 Too Many Requests to the last try: it refused the call before doing
    /// anything (its throttling, TN3194), so a code sent with it is still unused, unlike after a
    /// lost answer (a timeout, a 5xx), which may have used it up (protocol reference §11.4).
    public var isTooManyRequests: Bool {
        if case .unavailable(let reason, _) = self { return reason.hasPrefix(Self.tooManyRequestsPrefix) }
        return false
    }

    /// How `AppleClient` begins the reason of a call whose last answer was 429.
    static let tooManyRequestsPrefix = "Apple answered 429 "

    /// Apple's `Retry-After` in seconds, when the failure carried one.
    public var retryAfter: Int? {
        if case .unavailable(_, let retryAfter) = self { return retryAfter }
        return nil
    }

    public var description: String {
        switch self {
        case .invalidGrant(let detail): "invalid_grant\(detail.map { ": \($0)" } ?? "")"
        case .invalidClient: "invalid_client"
        case .rejected(let status, let error, let detail):
            "rejected with \(status) \(error ?? "")\(detail.map { ": \($0)" } ?? "")"
        case .unavailable(let reason, _): "unavailable: \(reason)"
        case .malformedResponse(let reason): "malformed response: \(reason)"
        }
    }
}
