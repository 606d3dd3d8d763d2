import BrokerCore
import StrictJSON

/// A relying party's registration (RFC 7591 §2), checked: what the registration endpoint,
/// the command line and the store share.
package struct ClientMetadata: Sendable, Equatable {
    package var redirectURIs: [String]
    package var tokenEndpointAuthMethod: String
    package var grantTypes: [String]
    package var responseTypes: [String]
    package var clientName: String?
    package var scope: String
    package var backchannelLogoutURI: String?
    package var backchannelLogoutSessionRequired: Bool
    /// RP-Initiated Logout 1.0 §3.1: where the end-session endpoint may send the browser back.
    package var postLogoutRedirectURIs: [String] = []

    package var isPublic: Bool { tokenEndpointAuthMethod == "none" }
    package var scopes: Set<String> { Set(scope.split(separator: " ").map(String.init)) }

    static let authMethods: Set<String> = ["client_secret_basic", "client_secret_post", "none"]
    static let grantTypeNames: Set<String> = ["authorization_code", "refresh_token"]

    /// Checks the metadata; unset members take RFC 7591's defaults (`client_secret_basic`,
    /// `authorization_code`, `code`) and the provider's scopes.
    /// - Parameter logoutURI: checks a `backchannel_logout_uri` against the webhook address rules.
    package init(
        redirectURIs: [String]?, tokenEndpointAuthMethod: String?, grantTypes: [String]?, responseTypes: [String]?,
        clientName: String?, scope: String?, backchannelLogoutURI: String?, backchannelLogoutSessionRequired: Bool?,
        logoutURI check: (String) throws -> String
    ) throws {
        let method = tokenEndpointAuthMethod ?? "client_secret_basic"
        guard Self.authMethods.contains(method) else {
            throw OAuthError.invalidClientMetadata(
                "token_endpoint_auth_method must be client_secret_basic, client_secret_post or none")
        }
        guard let redirectURIs, !redirectURIs.isEmpty else {
            throw OAuthError.invalidRedirectURI("redirect_uris is required (the authorization code flow redirects)")
        }
        guard redirectURIs.count <= ProviderPolicy.maximumRedirectURIs else {
            throw OAuthError.invalidRedirectURI("at most \(ProviderPolicy.maximumRedirectURIs) redirect_uris")
        }
        for uri in redirectURIs {
            if let refusal = RedirectURIRule.refusal(uri, publicClient: method == "none") {
                throw OAuthError.invalidRedirectURI("\(uri.prefix(200)): \(refusal)")
            }
        }
        let grants = grantTypes ?? ["authorization_code"]
        guard !grants.isEmpty, Set(grants).isSubset(of: Self.grantTypeNames), grants.contains("authorization_code") else {
            throw OAuthError.invalidClientMetadata("grant_types: authorization_code, optionally refresh_token")
        }
        let responses = responseTypes ?? ["code"]
        guard responses == ["code"] else {
            throw OAuthError.invalidClientMetadata("response_types: only code (the authorization code flow)")
        }
        if let clientName, clientName.isEmpty || clientName.utf8.count > 200 {
            throw OAuthError.invalidClientMetadata("client_name: 1 to 200 bytes")
        }
        let scopes = (scope ?? "openid email profile offline_access").split(separator: " ").map(String.init)
        guard !scopes.isEmpty, Set(scopes).isSubset(of: ProviderPolicy.scopes), scopes.contains("openid") else {
            throw OAuthError.invalidClientMetadata("scope: openid and any of email, profile, offline_access")
        }
        var logout: String?
        if let backchannelLogoutURI {
            guard !backchannelLogoutURI.contains("#") else {
                throw OAuthError.invalidClientMetadata("backchannel_logout_uri: no fragment")
            }
            do {
                logout = try check(backchannelLogoutURI)
            } catch let error as BrokerError {
                throw OAuthError.invalidClientMetadata("backchannel_logout_uri: \(error.detail)")
            }
        }
        self.redirectURIs = redirectURIs
        self.tokenEndpointAuthMethod = method
        self.grantTypes = Array(Set(grants)).sorted()
        self.responseTypes = responses
        self.clientName = clientName
        self.scope = scopes.joined(separator: " ")
        self.backchannelLogoutURI = logout
        self.backchannelLogoutSessionRequired = backchannelLogoutSessionRequired ?? false
    }

    /// Sets `post_logout_redirect_uris` (RP-Initiated Logout 1.0 §3.1), checked as redirect URIs are.
    package mutating func setPostLogoutRedirectURIs(_ uris: [String]) throws {
        guard uris.count <= ProviderPolicy.maximumRedirectURIs else {
            throw OAuthError.invalidClientMetadata("at most \(ProviderPolicy.maximumRedirectURIs) post_logout_redirect_uris")
        }
        for uri in uris {
            if let refusal = RedirectURIRule.refusal(uri, publicClient: isPublic) {
                throw OAuthError.invalidClientMetadata("post_logout_redirect_uris: \(uri.prefix(200)): \(refusal)")
            }
        }
        postLogoutRedirectURIs = uris
    }

    /// Reads an RFC 7591 registration request.
    package init(json body: JSONObjectReader, logoutURI check: (String) throws -> String) throws {
        do {
            try self.init(
                redirectURIs: try body.strings("redirect_uris"),
                tokenEndpointAuthMethod: try body.string("token_endpoint_auth_method"),
                grantTypes: try body.strings("grant_types"), responseTypes: try body.strings("response_types"),
                clientName: try body.string("client_name"), scope: try body.string("scope"),
                backchannelLogoutURI: try body.string("backchannel_logout_uri"),
                backchannelLogoutSessionRequired: try body.bool("backchannel_logout_session_required"), logoutURI: check)
            try setPostLogoutRedirectURIs(try body.strings("post_logout_redirect_uris") ?? [])
        } catch let error as JSONFieldError {
            throw OAuthError.invalidClientMetadata(error.description)
        }
    }

    /// The registration answer's metadata members (RFC 7591 §3.2.1).
    var json: [String: JSONValue] {
        var members: [String: JSONValue] = [
            "redirect_uris": .array(redirectURIs.map(JSONValue.string)),
            "token_endpoint_auth_method": .string(tokenEndpointAuthMethod),
            "grant_types": .array(grantTypes.map(JSONValue.string)),
            "response_types": .array(responseTypes.map(JSONValue.string)), "scope": .string(scope),
            "backchannel_logout_session_required": .bool(backchannelLogoutSessionRequired),
        ]
        if let clientName { members["client_name"] = .string(clientName) }
        if let backchannelLogoutURI { members["backchannel_logout_uri"] = .string(backchannelLogoutURI) }
        if !postLogoutRedirectURIs.isEmpty {
            members["post_logout_redirect_uris"] = .array(postLogoutRedirectURIs.map(JSONValue.string))
        }
        return members
    }
}
