import AppleID

/// A failure in the broker's own terms, thrown by its services: a stable code (the problem
/// `code` clients switch on) and a detail for humans that holds no secret and no personal data.
///
/// Services know nothing of HTTP; `HTTP/ProblemCatalog.swift` gives every code its status
/// and title, and is the one list of the codes the API answers with.
public struct BrokerError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Every domain failure, by its problem code.
    public enum Code: String, Sendable, CaseIterable {
        // Input that is not what the endpoint takes.
        case invalidRequest = "invalid_request"
        case invalidClientID = "invalid_client_id"
        case invalidUserID = "invalid_user_id"
        case invalidDeletionID = "invalid_deletion_id"
        case invalidSubscriptionID = "invalid_subscription_id"
        case invalidCursor = "invalid_cursor"
        case invalidTopic = "invalid_topic"
        case invalidWebhookURL = "invalid_webhook_url"
        case notificationMalformed = "notification_malformed"
        case redirectURINotRegistered = "redirect_uri_not_registered"
        case authorizationCodeInvalid = "authorization_code_invalid"
        // Web sign-in.
        case webSignInNotConfigured = "web_signin_not_configured"
        case webClientUnknown = "web_client_unknown"
        case returnToNotRegistered = "return_to_not_registered"
        case invalidState = "invalid_state"
        case resultCodeInvalid = "result_code_invalid"
        // Who may do what.
        case unauthorized
        case insufficientScope = "insufficient_scope"
        case clientNotAllowed = "client_not_allowed"
        /// A key limited to some apps asked to delete a user other apps share.
        case userSharedWithOtherApps = "user_shared_with_other_apps"
        // Things that are not there, or not in the state asked for.
        case userNotFound = "user_not_found"
        case userDeleted = "user_deleted"
        case userDeletionPending = "user_deletion_pending"
        case deletionNotFound = "deletion_not_found"
        case deletionNotFailed = "deletion_not_failed"
        /// A handed-over code for a deletion that cannot use it (failed: retry it first; past
        /// its revocation): refused unsent, so it stays good for its five minutes.
        case deletionCodeRefused = "deletion_code_refused"
        case subscriptionNotFound = "subscription_not_found"
        /// A resource server named a relying party that is not registered.
        case oidcClientNotFound = "oidc_client_not_found"
        case deliveryNotFailed = "delivery_not_failed"
        case webhookSubscriptionLimit = "webhook_subscription_limit"
        /// Over a per-user budget (code exchanges), with `Retry-After`.
        case rateLimited = "rate_limited"
        // Dependencies.
        case appleClientRejected = "apple_client_rejected"
        case appleResponseInvalid = "apple_response_invalid"
        case appleUnavailable = "apple_unavailable"
        case databaseUnavailable = "database_unavailable"
        case shuttingDown = "shutting_down"

        /// A refusal of this request, as opposed to a dependency (Apple, the database, this
        /// process) failing it: asking again with the same input gets the same answer.
        public var isRefusal: Bool {
            switch self {
            case .appleClientRejected, .appleResponseInvalid, .appleUnavailable, .databaseUnavailable, .shuttingDown: false
            default: true
            }
        }
    }

    public var code: Code
    public var detail: String
    /// For a dependency that is down: when to try again.
    public var retryAfterSeconds: Int?
    /// Facts the caller may act on (`deletion_id` of a deleted user), as string members.
    public var extensions: [String: String]

    public init(_ code: Code, _ detail: String, retryAfterSeconds: Int? = nil, extensions: [String: String] = [:]) {
        self.code = code
        self.detail = detail
        self.retryAfterSeconds = retryAfterSeconds
        self.extensions = extensions
    }

    public var description: String { "\(code.rawValue): \(detail)" }

    /// 400 `invalid_request`: the body or the query is not what the endpoint takes.
    package static func invalidRequest(_ detail: String) -> BrokerError { BrokerError(.invalidRequest, detail) }

    package static let userNotFound = BrokerError(.userNotFound, "no user with this id")

    static let deletionPending = BrokerError(
        .userDeletionPending, "this user's account is being deleted; sign-in is refused until it is done")

    static func appleUnavailable(_ detail: String) -> BrokerError {
        BrokerError(.appleUnavailable, detail, retryAfterSeconds: 5)
    }

    /// 403 `client_not_allowed`: the API key is limited to other apps.
    static func clientNotAllowed(_ clientID: String) -> BrokerError {
        BrokerError(.clientNotAllowed, "this API key is limited to other apps than \(clientID)")
    }

    package static func userDeleted(_ detail: String, deletionID: String) -> BrokerError {
        BrokerError(.userDeleted, detail, extensions: ["deletion_id": deletionID])
    }

    /// What went wrong talking to Apple, in these terms.
    init(_ error: AppleAPIError) {
        switch error {
        case .invalidGrant:
            self.init(.authorizationCodeInvalid, "Apple refused the authorization code (expired, used, or for another client id)")
        case .invalidClient:
            self.init(
                .appleClientRejected,
                "Apple answered invalid_client: check APPLE_TEAM_ID, APPLE_KEY_ID, the .p8 key and APPLE_CLIENT_IDS")
        case .rejected, .malformedResponse:
            self.init(.appleResponseInvalid, "\(error)")
        case .unavailable(_, let retryAfter):
            // Apple's own Retry-After reaches the caller (at least our 5 s default).
            self.init(.appleUnavailable, "Apple did not answer after retries", retryAfterSeconds: max(retryAfter ?? 5, 1))
        }
    }
}
