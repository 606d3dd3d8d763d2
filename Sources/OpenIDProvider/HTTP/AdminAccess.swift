import BrokerCore
import HTTPServer
import StrictJSON

/// Who may use the provider's admin routes (registrations, resource servers, logout
/// re-drives, key rotation): an API key with the `admin` scope that reaches the provider's
/// Services ID (`OIDC_APPLE_CLIENT_ID`). A key limited by `--client-ids` to other apps is
/// refused (403 `client_not_allowed`), and the refusal is audited: every relying party signs
/// in that app's users, so whoever manages them acts for that app.
struct AdminAccess: Sendable {
    let authorize: @Sendable (HTTPRequest) throws -> APIKey
    let appleClientID: String

    /// The audited actor (`api:<key id>`) of an authorized request.
    /// - Throws: the key's refusals (401, 403 `insufficient_scope`, 429), or 403
    ///   `client_not_allowed` for a key that does not reach the provider (audited as `action`).
    func actor(_ request: HTTPRequest, action: String, target: String? = nil, audit: AdminAuditStore) throws -> String {
        let key = try authorize(request)
        let actor = "api:" + key.id
        guard key.reaches(appleClientID) else {
            try audit.record(actor: actor, action: action, target: target, outcome: "refused_client_not_allowed")
            throw BrokerError(
                .clientNotAllowed, "this API key is limited to apps other than the OpenID Provider's (OIDC_APPLE_CLIENT_ID)")
        }
        return actor
    }

    /// `actor` for RFC 7591's registration endpoint, whose refusals are RFC 6750's (§3.1):
    /// 401 `invalid_token` for a missing or bad key, 403 `insufficient_scope` for a key that may
    /// not register, each with `WWW-Authenticate: Bearer`; never a problem document.
    func registrationActor(_ request: HTTPRequest, audit: AdminAuditStore) throws -> String {
        do {
            return try actor(request, action: "oidc_client.created", audit: audit)
        } catch let error as BrokerError {
            switch error.code {
            case .unauthorized:
                throw BearerRefusal(
                    status: 401, error: "invalid_token",
                    description: request.bearerToken == nil
                        ? "send an API key with the admin scope as Authorization: Bearer <key>" : "the API key is not valid")
            case .insufficientScope, .clientNotAllowed:
                throw BearerRefusal(status: 403, error: "insufficient_scope", description: error.detail)
            default: throw error
            }
        }
    }
}

/// An RFC 6750 §3 refusal: the `WWW-Authenticate: Bearer` challenge and the same error as JSON.
struct BearerRefusal: Error {
    let status: Int
    let error: String
    let description: String

    var response: HTTPResponse {
        let oauth = OAuthError(error, description, status: status)
        var response = oauth.response
        response.headers.set(
            "WWW-Authenticate", "Bearer error=\"\(oauth.code)\", error_description=\"\(oauth.description)\"")
        return response
    }
}
