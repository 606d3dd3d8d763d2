import BrokerCore
import BrokerCrypto
import Foundation
import Locking
import Observability
import StrictJSON
import Synchronization

/// The token, userinfo and revocation endpoints (OpenID Connect Core §3.1.3 and §5.3,
/// RFC 6749 §4.1.3 and §6, RFC 7636 §4.6, RFC 7009, RFC 7662). Every refusal is an OAuth error.
package struct TokenService: Sendable {
    let endpoints: Endpoints
    var issuer: String { endpoints.issuer }
    let grants: GrantStore
    /// BrokerCore's users: the claims come from the user's Apple identity, read through it.
    let users: UserDirectory
    let keys: SigningKeys
    let authentication: ClientAuthentication
    let resourceServers: ResourceServerStore
    private let outcomes: CounterFamily
    private let issued: CounterFamily
    private let revocations: CounterFamily
    private let introspections: CounterFamily
    private let clientLabels = ClientLabels(maximum: ProviderPolicy.maximumClientLabels)

    init(
        endpoints: Endpoints, clients: ClientStore, grants: GrantStore, users: UserDirectory, keys: SigningKeys,
        clientKeys: ClientKeys,
        resourceServers: ResourceServerStore, assertions: ClientAssertionStore, metrics: MetricsRegistry
    ) {
        self.endpoints = endpoints
        self.grants = grants
        self.users = users
        self.keys = keys
        self.resourceServers = resourceServers
        authentication = ClientAuthentication(
            clients: clients, keys: clientKeys, assertions: assertions,
            audiences: [endpoints.issuer, endpoints.url(Endpoints.token)])
        outcomes = metrics.counter(
            "oidc_token_requests_total", help: "Token endpoint requests by grant type and outcome: success or the OAuth error.",
            labels: ["grant_type", "outcome"])
        issued = metrics.counter(
            "oidc_tokens_issued_total",
            help: "Successful token requests by client (the first 200 client ids; later ones as other) and grant type.",
            labels: ["client_id", "grant_type"])
        revocations = metrics.counter(
            "oidc_revocations_total", help: "Revocation requests (RFC 7009) by outcome: success or the OAuth error.",
            labels: ["outcome"])
        introspections = metrics.counter(
            "oidc_introspections_total",
            help: "Introspection requests (RFC 7662) by outcome: active, inactive or the OAuth error.", labels: ["outcome"])
    }

    /// `POST /token` with its form fields.
    func token(_ credentials: ClientCredentials) throws -> JSONValue {
        let form = credentials.form
        // Only the known grant types label the metric: a caller cannot invent labels.
        let grantType =
            ["authorization_code", "refresh_token"].contains(form["grant_type"] ?? "") ? form["grant_type"]! : "other"
        do {
            let client = try authentication.authenticate(credentials, endpoint: endpoints.url(Endpoints.token))
            let answer: JSONValue
            switch form["grant_type"] {
            case "authorization_code": answer = try exchange(form, client: client)
            case "refresh_token": answer = try refresh(form, client: client)
            case nil: throw OAuthError.invalidRequest("grant_type is required")
            default: throw OAuthError("unsupported_grant_type", "authorization_code or refresh_token")
            }
            outcomes.increment(grantType, "success")
            issued.increment(clientLabels.label(client.clientID), grantType)
            return answer
        } catch let error as OAuthError {
            outcomes.increment(grantType, error.code)
            throw error
        } catch let failure as ClientAuthenticationFailure {
            outcomes.increment(grantType, "invalid_client")
            throw failure
        }
    }

    private func exchange(_ form: [String: String], client: ClientStore.Client) throws -> JSONValue {
        guard let code = form["code"] else { throw OAuthError.invalidRequest("code is required") }
        // Longer than any code we issue: not looked up, and invalid like any unknown code (RFC 6749 §5.2).
        guard code.utf8.count <= 256 else { throw OAuthError.invalidGrant("the code is unknown or expired") }
        guard let redirectURI = form["redirect_uri"] else { throw OAuthError.invalidRequest("redirect_uri is required") }
        let verifier = form["code_verifier"]
        if let verifier, !CodeChallenge.isWellFormed(verifier) {
            throw OAuthError.invalidRequest("code_verifier must be 43 to 128 characters of A-Z, a-z, 0-9, -, ., _, ~")
        }
        switch try grants.redeem(code: code, clientID: client.clientID) {
        case .unknown, .expired: throw OAuthError.invalidGrant("the code is unknown or expired")
        case .spent: throw OAuthError.invalidGrant("the code was used already; the tokens it gave are revoked")
        case .otherClient: throw OAuthError.invalidGrant("the code was issued to another client")
        case .found(let grant, let boundRedirect, let challenge, let nonce):
            guard redirectURI == boundRedirect else {
                throw OAuthError.invalidGrant("redirect_uri differs from the authorization request's")
            }
            switch (challenge, verifier) {
            case (let challenge?, let verifier?):
                guard CodeChallenge.matches(verifier: verifier, challenge: challenge) else {
                    throw OAuthError.invalidGrant("code_verifier does not match the code_challenge")
                }
            case (.some, nil): throw OAuthError.invalidGrant("code_verifier is required (PKCE)")
            // RFC 9700 §2.1.1: a verifier for a code issued without a challenge is a downgrade attempt.
            case (nil, .some): throw OAuthError.invalidGrant("the authorization request carried no code_challenge")
            case (nil, nil): break
            }
            return try answer(grant, client: client, nonce: nonce)
        }
    }

    private func refresh(_ form: [String: String], client: ClientStore.Client) throws -> JSONValue {
        guard client.metadata.grantTypes.contains("refresh_token") else {
            throw OAuthError("unauthorized_client", "this client did not register the refresh_token grant")
        }
        guard let token = form["refresh_token"] else { throw OAuthError.invalidRequest("refresh_token is required") }
        guard token.utf8.count <= 256 else { throw OAuthError.invalidGrant("the refresh token is unknown, expired or revoked") }
        // RFC 6749 §6: a scope the grant does not hold is invalid_scope, checked before the token
        // is used: spent by a refused request, its retry would look like reuse and end the grant.
        let requested = form["scope"].map { Set($0.split(separator: " ").map(String.init)) }
        if let requested, requested.isEmpty { throw OAuthError("invalid_scope", "the scope is empty") }
        if let requested, let held = try grants.scopes(ofUnusedRefreshToken: token, clientID: client.clientID),
            !requested.isSubset(of: held)
        {
            throw OAuthError("invalid_scope", "a refresh cannot widen the scope")
        }
        switch try grants.useRefreshToken(token, clientID: client.clientID) {
        case .unknown: throw OAuthError.invalidGrant("the refresh token is unknown, expired or revoked")
        case .reused: throw OAuthError.invalidGrant("the refresh token was used already; the grant is ended")
        case .found(let grant):
            if let requested, !requested.isSubset(of: grant.scopes) {
                throw OAuthError("invalid_scope", "a refresh cannot widen the scope")
            }
            // RFC 6749 §6: the access token (and the ID token's claims) get what was asked for, in
            // the grant's order; the new refresh token keeps the grant's whole scope.
            let narrowed = requested.map { requested in
                grant.scope.split(separator: " ").filter { requested.contains(String($0)) }.joined(separator: " ")
            }
            return try answer(grant, client: client, nonce: nil, narrowedTo: narrowed == grant.scope ? nil : narrowed)
        }
    }

    /// Tokens for a grant: access token, ID token, and a refresh token with offline_access.
    /// - Parameter narrowedTo: a refresh's smaller scope for the access token and the ID token's claims.
    private func answer(
        _ grant: GrantStore.Grant, client: ClientStore.Client, nonce: String?, narrowedTo scope: String? = nil
    ) throws -> JSONValue {
        let offline = grant.scopes.contains("offline_access") && client.metadata.grantTypes.contains("refresh_token")
        let tokens = try grants.issueTokens(grantID: grant.id, refresh: offline, accessScope: scope)
        var grant = grant
        if let scope { grant.scope = scope }
        let now = Int64(Date().timeIntervalSince1970)
        var claims: [String: JSONValue] = [
            "iss": .string(issuer), "sub": .string(grant.userID.uuidString.lowercased()), "aud": .string(client.clientID),
            "iat": .integer(now), "exp": .integer(now + Int64(ProviderPolicy.idTokenLifetimeSeconds)),
            "auth_time": .integer(Int64(grant.authTime.timeIntervalSince1970)), "sid": .string(grant.sid),
            // OpenID Connect Core §3.1.3.6: the left half of the access token's SHA-256.
            "at_hash": .string(Base64URL.encode(Array(SHA256.hash(tokens.access).prefix(16)))),
        ]
        if let nonce { claims["nonce"] = .string(nonce) }
        try claims.merge(profileClaims(grant)) { $1 }
        var members: [String: JSONValue] = [
            "access_token": .string(tokens.access), "token_type": "Bearer",
            "expires_in": .integer(Int64(ProviderPolicy.accessTokenLifetimeSeconds)),
            "id_token": .string(try keys.sign(claims)), "scope": .string(grant.scope),
        ]
        if let refresh = tokens.refresh { members["refresh_token"] = .string(refresh) }
        return .object(members)
    }

    /// The claims `email` and `profile` give, from the user's identity as it is now.
    private func profileClaims(_ grant: GrantStore.Grant) throws -> [String: JSONValue] {
        let scopes = grant.scopes
        guard scopes.contains("email") || scopes.contains("profile"),
            let identity = try users.profile(of: grant.userID, appID: grants.appID)
        else { return [:] }
        var claims: [String: JSONValue] = [:]
        if scopes.contains("email"), let email = identity.email {
            claims["email"] = .string(email)
            claims["email_verified"] = .bool(identity.emailVerified)
            claims["is_private_email"] = .bool(identity.isPrivateEmail)
            // Apple's email-disabled / email-enabled (a relay address that no longer forwards).
            claims["email_forwarding"] = .string(identity.emailForwarding)
        }
        if scopes.contains("profile") {
            // The name RPs show and often key accounts on (Home Assistant, Grafana, Nextcloud):
            // the e-mail when the grant has the email scope and there is one, else the sub (a
            // stable handle, unique, no personal data). It may change with the e-mail (OpenID
            // Connect Core §5.7: RPs must key on sub).
            let email = scopes.contains("email") ? identity.email : nil
            claims["preferred_username"] = .string(email ?? grant.userID.uuidString.lowercased())
            if let given = identity.givenName { claims["given_name"] = .string(given) }
            if let family = identity.familyName { claims["family_name"] = .string(family) }
            let name = [identity.givenName, identity.familyName].compactMap { $0 }.joined(separator: " ")
            if !name.isEmpty { claims["name"] = .string(name) }
        }
        return claims
    }

    /// Userinfo: the claims of the access token's grant, or nil when the token is not live.
    func userinfo(accessToken: String) throws -> JSONValue? {
        guard let grant = try grants.grant(accessToken: accessToken) else { return nil }
        var claims = try profileClaims(grant)
        claims["sub"] = .string(grant.userID.uuidString.lowercased())
        return .object(claims)
    }

    /// RFC 7009 revocation: 200 whatever the token was, once the client authenticated.
    func revoke(_ credentials: ClientCredentials) throws {
        do {
            let client = try authentication.authenticate(credentials, endpoint: endpoints.url(Endpoints.revocation))
            guard let token = credentials.form["token"], !token.isEmpty else {
                throw OAuthError.invalidRequest("token is required")
            }
            try grants.revoke(token, clientID: client.clientID)
            revocations.increment("success")
        } catch let error as OAuthError {
            revocations.increment(error.code)
            throw error
        } catch let failure as ClientAuthenticationFailure {
            revocations.increment("invalid_client")
            throw failure
        }
    }

    /// RFC 7662 introspection by a registered resource server (client_secret_basic or
    /// client_secret_post with its own secret). A live access token issued to one of the
    /// relying parties it serves is active; anything else, including refresh tokens and
    /// other audiences' tokens, is `{"active": false}` (§2.2: nothing more is said).
    func introspect(_ credentials: ClientCredentials) throws -> JSONValue {
        do {
            let server = try authenticateResourceServer(credentials)
            guard let token = credentials.form["token"], !token.isEmpty else {
                throw OAuthError.invalidRequest("token is required")
            }
            guard let (grant, expiresAt) = try grants.introspect(accessToken: token),
                server.clientIDs.contains(grant.clientID)
            else {
                introspections.increment("inactive")
                return .object(["active": .bool(false)])
            }
            introspections.increment("active")
            let exp = Int64(expiresAt.timeIntervalSince1970)
            return .object([
                "active": .bool(true), "scope": .string(grant.scope), "client_id": .string(grant.clientID),
                "sub": .string(grant.userID.uuidString.lowercased()), "token_type": .string("Bearer"),
                "exp": .integer(exp), "iat": .integer(exp - Int64(ProviderPolicy.accessTokenLifetimeSeconds)),
                "iss": .string(issuer), "aud": .string(server.id), "sid": .string(grant.sid),
            ])
        } catch let error as OAuthError {
            introspections.increment(error.code)
            throw error
        } catch let failure as ClientAuthenticationFailure {
            introspections.increment("invalid_client")
            throw failure
        }
    }

    private func authenticateResourceServer(_ credentials: ClientCredentials) throws -> ResourceServerStore.ResourceServer {
        let form = credentials.form
        if credentials.malformedAuthorization { throw ClientAuthentication.failed(basic: true) }
        if credentials.basic != nil && form["client_secret"] != nil {
            throw OAuthError.invalidRequest("use one client authentication method")
        }
        guard let id = credentials.basic?.id ?? form["client_id"],
            let secret = credentials.basic?.secret ?? form["client_secret"],
            let server = try resourceServers.find(id), server.accepts(secret: secret)
        else { throw ClientAuthentication.failed(basic: credentials.basic != nil) }
        return server
    }
}

/// Client ids as metric label values: the first `maximum` seen keep their own; later ones are
/// `other`, so registrations cannot grow /metrics without bound.
final class ClientLabels: Sendable {
    let maximum: Int
    private let seen = Lock<Set<String>>([])

    init(maximum: Int) { self.maximum = maximum }

    func label(_ clientID: String) -> String {
        seen.withLock { seen in
            if seen.contains(clientID) { return clientID }
            guard seen.count < maximum else { return "other" }
            seen.insert(clientID)
            return clientID
        }
    }
}
