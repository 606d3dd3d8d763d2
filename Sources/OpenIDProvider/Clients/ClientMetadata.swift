import BrokerCore
import JOSE
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
    /// private_key_jwt: the client's public keys as a JWK Set (JSON text), or where to fetch them.
    package var jwks: String?
    package var jwksURI: String?
    /// `token_endpoint_auth_signing_alg` (RS256 or ES256); nil: either.
    package var signingAlgorithm: String?
    /// The admin's opt-in to plain-http redirect URIs on private-network hosts (home labs).
    package var privateNetworkHTTPRedirects: Bool = false

    package var isPublic: Bool { tokenEndpointAuthMethod == "none" }
    /// Authenticates with a signed client assertion (RFC 7523) rather than a shared secret.
    package var usesPrivateKeyJWT: Bool { tokenEndpointAuthMethod == "private_key_jwt" }
    package var scopes: Set<String> { Set(scope.split(separator: " ").map(String.init)) }

    static let authMethods: Set<String> = ["client_secret_basic", "client_secret_post", "private_key_jwt", "none"]
    static let grantTypeNames: Set<String> = ["authorization_code", "refresh_token"]
    static let signingAlgorithms: Set<String> = ["RS256", "ES256"]
    /// A registered JWK Set's size bound (a handful of public keys).
    static let maximumJWKSBytes = 16 * 1024

    /// Checks the metadata; unset members take RFC 7591's defaults (`client_secret_basic`,
    /// `authorization_code`, `code`) and the provider's scopes.
    /// - Parameter outboundURL: checks a `backchannel_logout_uri` or `jwks_uri` against the
    ///   webhook address rules (the broker sends requests there).
    package init(
        redirectURIs: [String]?, tokenEndpointAuthMethod: String?, grantTypes: [String]?, responseTypes: [String]?,
        clientName: String?, scope: String?, backchannelLogoutURI: String?, backchannelLogoutSessionRequired: Bool?,
        jwks: JSONValue? = nil, jwksURI: String? = nil, signingAlgorithm: String? = nil,
        privateNetworkHTTPRedirects: Bool = false, outboundURL check: (String) throws -> String
    ) throws {
        let method = tokenEndpointAuthMethod ?? "client_secret_basic"
        guard Self.authMethods.contains(method) else {
            throw OAuthError.invalidClientMetadata(
                "token_endpoint_auth_method must be client_secret_basic, client_secret_post, private_key_jwt or none")
        }
        guard let redirectURIs, !redirectURIs.isEmpty else {
            throw OAuthError.invalidRedirectURI("redirect_uris is required (the authorization code flow redirects)")
        }
        guard redirectURIs.count <= ProviderPolicy.maximumRedirectURIs else {
            throw OAuthError.invalidRedirectURI("at most \(ProviderPolicy.maximumRedirectURIs) redirect_uris")
        }
        for uri in redirectURIs {
            if let refusal = RedirectURIRule.refusal(
                uri, publicClient: method == "none", privateNetworkHTTP: privateNetworkHTTPRedirects)
            {
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
        // Characters (Unicode scalars), as the API description's maxLength counts them.
        if let clientName, clientName.isEmpty || clientName.unicodeScalars.count > 200 {
            throw OAuthError.invalidClientMetadata("client_name: 1 to 200 characters")
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
        // private_key_jwt (RFC 7523 §2.2, OpenID Connect Core §9): exactly one key source.
        if method == "private_key_jwt" {
            guard (jwks == nil) != (jwksURI == nil) else {
                throw OAuthError.invalidClientMetadata("private_key_jwt needs exactly one of jwks and jwks_uri")
            }
        } else if jwks != nil || jwksURI != nil {
            throw OAuthError.invalidClientMetadata("jwks and jwks_uri are for token_endpoint_auth_method private_key_jwt")
        }
        if let signingAlgorithm, !Self.signingAlgorithms.contains(signingAlgorithm) || method != "private_key_jwt" {
            throw OAuthError.invalidClientMetadata("token_endpoint_auth_signing_alg: RS256 or ES256, with private_key_jwt")
        }
        self.jwks = try jwks.map(Self.checkedJWKS)
        if let jwksURI {
            do {
                self.jwksURI = try check(jwksURI)
            } catch let error as BrokerError {
                throw OAuthError.invalidClientMetadata("jwks_uri: \(error.detail)")
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
        self.signingAlgorithm = signingAlgorithm
        self.privateNetworkHTTPRedirects = privateNetworkHTTPRedirects
    }

    /// A registered JWK Set: bounded, public keys only, at least one that can verify.
    static func checkedJWKS(_ value: JSONValue) throws -> String {
        guard case .object(let set) = value, let keys = set["keys"]?.arrayValue, !keys.isEmpty, keys.count <= 16 else {
            throw OAuthError.invalidClientMetadata("jwks: a JWK Set with 1 to 16 keys")
        }
        // A private member means the client sent its private key: refused, never stored.
        let privateMembers: Set<String> = ["d", "p", "q", "dp", "dq", "qi", "oth", "k"]
        guard keys.allSatisfy({ $0.objectValue.map { Set($0.keys).isDisjoint(with: privateMembers) } ?? false }) else {
            throw OAuthError.invalidClientMetadata("jwks: public keys only (a private key member was sent)")
        }
        let text = value.serialized()
        guard text.count <= maximumJWKSBytes else { throw OAuthError.invalidClientMetadata("jwks: at most 16 KiB") }
        guard let parsed = try? JWKSet(json: text), parsed.keys.contains(where: \.canVerify) else {
            throw OAuthError.invalidClientMetadata("jwks: no usable RSA (2048 bits or more) or EC P-256 signing key")
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// Sets `post_logout_redirect_uris` (RP-Initiated Logout 1.0 §3.1), checked as redirect URIs are.
    package mutating func setPostLogoutRedirectURIs(_ uris: [String]) throws {
        guard uris.count <= ProviderPolicy.maximumRedirectURIs else {
            throw OAuthError.invalidClientMetadata("at most \(ProviderPolicy.maximumRedirectURIs) post_logout_redirect_uris")
        }
        for uri in uris {
            if let refusal = RedirectURIRule.refusal(
                uri, publicClient: isPublic, privateNetworkHTTP: privateNetworkHTTPRedirects)
            {
                throw OAuthError.invalidClientMetadata("post_logout_redirect_uris: \(uri.prefix(200)): \(refusal)")
            }
        }
        postLogoutRedirectURIs = uris
    }

    /// Reads an RFC 7591 registration request.
    package init(json body: JSONObjectReader, outboundURL check: (String) throws -> String) throws {
        do {
            try self.init(
                redirectURIs: try body.strings("redirect_uris"),
                tokenEndpointAuthMethod: try body.string("token_endpoint_auth_method"),
                grantTypes: try body.strings("grant_types"), responseTypes: try body.strings("response_types"),
                clientName: try body.string("client_name"), scope: try body.string("scope"),
                backchannelLogoutURI: try body.string("backchannel_logout_uri"),
                backchannelLogoutSessionRequired: try body.bool("backchannel_logout_session_required"),
                jwks: try body.object("jwks").map { .object($0.members) }, jwksURI: try body.string("jwks_uri"),
                signingAlgorithm: try body.string("token_endpoint_auth_signing_alg"),
                privateNetworkHTTPRedirects: try body.bool(Self.privateNetworkHTTPMember) ?? false, outboundURL: check)
            try setPostLogoutRedirectURIs(try body.strings("post_logout_redirect_uris") ?? [])
        } catch let error as JSONFieldError {
            throw OAuthError.invalidClientMetadata(error.description)
        }
    }

    /// The registration member of the home-lab opt-in (not an RFC 7591 name: the broker's own).
    static let privateNetworkHTTPMember = "private_network_http_redirects"

    /// The registration answer's metadata members (RFC 7591 §3.2.1).
    var json: [String: JSONValue] {
        var members: [String: JSONValue] = [
            "redirect_uris": .array(redirectURIs.map(JSONValue.string)),
            "token_endpoint_auth_method": .string(tokenEndpointAuthMethod),
            "grant_types": .array(grantTypes.map(JSONValue.string)),
            "response_types": .array(responseTypes.map(JSONValue.string)), "scope": .string(scope),
            "backchannel_logout_session_required": .bool(backchannelLogoutSessionRequired),
            Self.privateNetworkHTTPMember: .bool(privateNetworkHTTPRedirects),
        ]
        if let clientName { members["client_name"] = .string(clientName) }
        if let backchannelLogoutURI { members["backchannel_logout_uri"] = .string(backchannelLogoutURI) }
        if !postLogoutRedirectURIs.isEmpty {
            members["post_logout_redirect_uris"] = .array(postLogoutRedirectURIs.map(JSONValue.string))
        }
        if let jwks, let value = try? JSONValue.parse(Array(jwks.utf8)) { members["jwks"] = value }
        if let jwksURI { members["jwks_uri"] = .string(jwksURI) }
        if let signingAlgorithm { members["token_endpoint_auth_signing_alg"] = .string(signingAlgorithm) }
        return members
    }
}
