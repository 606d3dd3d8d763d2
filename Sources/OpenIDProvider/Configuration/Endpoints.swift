import Foundation

/// Where the provider's endpoints are: under the issuer's path (an issuer of
/// `https://api.example.com/oidc` serves `/oidc/token`, `/oidc/.well-known/…`), so one
/// host can run the provider beside the broker's own API.
package struct Endpoints: Sendable {
    /// `OIDC_ISSUER`, without a trailing slash.
    package let issuer: String
    /// The issuer's path ("" or "/oidc"): the prefix of every route.
    package let pathPrefix: String

    package init(issuer: String) {
        self.issuer = issuer
        let afterScheme = issuer.range(of: "://").map { issuer[$0.upperBound...] } ?? issuer[...]
        pathPrefix = afterScheme.firstIndex(of: "/").map { String(afterScheme[$0...]) } ?? ""
    }

    /// The route path of an endpoint (`/authorize` → `/oidc/authorize`).
    package func path(_ endpoint: String) -> String { pathPrefix + endpoint }
    /// The absolute URL of an endpoint, as published in discovery.
    package func url(_ endpoint: String) -> String { issuer + endpoint }

    static let authorize = "/authorize"
    static let token = "/token"
    static let userinfo = "/userinfo"
    static let jwks = "/jwks"
    static let registration = "/register"
    static let revocation = "/revoke"
    /// RP-Initiated Logout 1.0 (`end_session_endpoint`) and its confirmation form's target.
    static let endSession = "/logout"
    static let endSessionConfirmation = "/logout/confirm"
    static let introspection = "/introspect"
    static let discovery = "/.well-known/openid-configuration"
    static let authorizationServer = "/.well-known/oauth-authorization-server"
}
