import AppleID
import BrokerCore
import HTTPServer
import PostgresClient

/// The one list of the problems the broker's API answers with: every domain error its
/// status and title. Services throw `BrokerError` and `TokenRejection`; the server turns
/// them into RFC 9457 problems here (its own codes, such as `not_found` and
/// `payload_too_large`, are `Problem.serverCodes`). `OpenAPITests` holds
/// `docs/openapi.json`'s codes to `documentedCodes`.
public enum ProblemCatalog {
    /// The HTTP face of each domain code.
    static func entry(_ code: BrokerError.Code) -> (status: Int, title: String) {
        switch code {
        case .invalidRequest: (400, "Invalid request")
        case .invalidClientID: (400, "Invalid client id")
        case .invalidUserID: (400, "Invalid user id")
        case .invalidDeletionID: (400, "Invalid deletion id")
        case .invalidSubscriptionID: (400, "Invalid subscription id")
        case .invalidCursor: (400, "Invalid cursor")
        case .invalidTopic: (400, "Invalid topic")
        case .invalidWebhookURL: (400, "Invalid webhook URL")
        case .notificationMalformed: (400, "Malformed notification")
        case .redirectURINotRegistered: (400, "redirect_uri not registered")
        case .authorizationCodeInvalid: (400, "Authorization code invalid")
        case .webSignInNotConfigured: (404, "Web sign-in not configured")
        case .webClientUnknown: (400, "Unknown web client")
        case .returnToNotRegistered: (400, "return_to not registered")
        case .invalidState: (400, "Invalid state")
        case .resultCodeInvalid: (400, "Invalid result code")
        case .unauthorized: (401, "Unauthorized")
        case .insufficientScope: (403, "Insufficient scope")
        case .clientNotAllowed: (403, "Client id not allowed")
        case .userSharedWithOtherApps: (403, "User shared with other apps")
        case .userNotFound: (404, "User not found")
        case .userDeleted: (410, "User deleted")
        case .userDeletionPending: (409, "Deletion pending")
        case .deletionNotFound: (404, "Deletion not found")
        case .deletionNotFailed: (409, "Not a failed deletion")
        case .deletionCodeRefused: (409, "Deletion cannot take the code")
        case .subscriptionNotFound: (404, "Subscription not found")
        case .oidcClientNotFound: (404, "Relying party not found")
        case .deliveryNotFailed: (409, "Not a failed delivery")
        case .webhookSubscriptionLimit: (409, "Webhook subscription limit reached")
        case .rateLimited: (429, "Too many requests")
        case .appleClientRejected: (502, "Apple refused our credentials")
        case .appleResponseInvalid: (502, "Apple's answer was invalid")
        case .appleUnavailable, .databaseUnavailable, .shuttingDown: (503, "Service unavailable")
        }
    }

    /// The HTTP face of each token rejection: 400 for a token that is not a JWT at all,
    /// 401 for everything that fails authentication.
    static func entry(_ code: TokenRejection.Code) -> (status: Int, title: String) {
        let title =
            switch code {
            case .tokenMalformed: "Malformed identity token"
            case .tokenSignatureInvalid: "Invalid signature"
            case .unknownKey: "Unknown signing key"
            case .tokenIssuerInvalid: "Invalid issuer"
            case .tokenAudienceInvalid: "Invalid audience"
            case .tokenExpired: "Token expired"
            case .tokenNotYetValid: "Token not yet valid"
            case .tokenTooOld: "Token too old"
            case .nonceMismatch: "Nonce mismatch"
            case .nonceMissing: "Nonce missing"
            }
        return (code == .tokenMalformed ? 400 : 401, title)
    }

    /// Every code a client can meet: the domain's, the token rejections' and the server's own.
    public static var documentedCodes: Set<String> {
        Set(BrokerError.Code.allCases.map(\.rawValue)).union(TokenRejection.Code.allCases.map(\.rawValue))
            .union(Problem.serverCodes)
    }

    static func problem(_ error: BrokerError) -> Problem {
        let (status, title) = entry(error.code)
        var headers: [String: String] = [:]
        if let seconds = error.retryAfterSeconds { headers["Retry-After"] = String(seconds) }
        if error.code == .unauthorized { headers["WWW-Authenticate"] = "Bearer realm=\"appleid-broker\"" }
        return Problem(
            status: status, code: error.code.rawValue, title: title, detail: error.detail, headers: headers,
            extensions: error.extensions)
    }

    static func problem(_ rejection: TokenRejection) -> Problem {
        let (status, title) = entry(rejection.code)
        return Problem(status: status, code: rejection.code.rawValue, title: title, detail: rejection.detail)
    }

    /// The server's error mapper: domain errors to their problems, a database outage to
    /// 503 with `Retry-After` (callers, Apple included, retry); anything else stays a 500.
    public static func problem(for error: any Error) -> Problem? {
        switch error {
        case let error as BrokerError: problem(error)
        case let rejection as TokenRejection: problem(rejection)
        case let error as PostgresError where error.isUnavailable:
            problem(BrokerError(.databaseUnavailable, "the database is unavailable; retry shortly", retryAfterSeconds: 5))
        default: nil
        }
    }
}
