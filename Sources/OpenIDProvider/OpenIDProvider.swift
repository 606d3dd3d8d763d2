import BrokerCore
import HTTPClient
import HTTPServer
import Observability
import PostgresClient
import StrictJSON

/// The OpenID Provider (issue 27): Sign in with Apple for every standard OpenID Connect
/// relying party. One folder per job: Configuration/ (endpoints, lifetimes, errors), Keys/
/// (RS256 keys in PostgreSQL), Clients/ (RFC 7591 registrations), Authorization/ (the
/// authorize endpoint and Apple's form post), Tokens/ (grants, codes, tokens, userinfo),
/// Sessions/ (the session at the provider, its cookie, ID token hints), Logout/ (RP-Initiated
/// Logout, Back-Channel Logout deliveries), HTTP/ (routes). It uses BrokerCore's services (login, the web callback's seam); BrokerCore
/// never imports it.
package final class OpenIDProvider: Sendable {
    package let endpoints: Endpoints
    package let authorization: AuthorizationService
    let tokens: TokenService
    package let clients: ClientStore
    package let resourceServers: ResourceServerStore
    package let keys: SigningKeys
    let logoutDeliveries: LogoutDeliveryStore
    let sessions: SessionStore
    let endSession: EndSessionService
    /// The webhook address rules, for `backchannel_logout_uri` and `jwks_uri`.
    let checkOutboundURL: @Sendable (String) throws -> String
    /// The Services ID the provider signs people in with: an API key limited by `--client-ids`
    /// manages the provider only when it reaches this one (its users are that app's).
    let appleClientID: String
    /// `OIDC_KEY_PREPUBLISH_SECONDS`, for `POST /v1/oidc-keys/rotate`.
    let keyPrepublish: Duration
    let cors: CORSOrigins

    /// Builds the provider and makes its first signing key when there is none.
    package init(
        settings: BrokerConfiguration.OpenIDProviderSettings, appleBaseURL: String, pool: PostgresPool,
        tokenKeys: TokenKeyRing, login: LoginService, groups: AppGroups, metrics: MetricsRegistry, allowPrivateNetworks: Bool,
        transport: (any HTTPTransport)? = nil
    ) throws {
        endpoints = Endpoints(issuer: settings.issuer)
        let store = SigningKeyStore(pool: pool, tokenKeys: tokenKeys)
        try store.ensureKey()
        keys = SigningKeys(store: store)
        clients = ClientStore(pool: pool)
        resourceServers = ResourceServerStore(pool: pool)
        appleClientID = settings.appleClientID
        keyPrepublish = settings.keyPrepublish
        cors = CORSOrigins(clients: clients)
        logoutDeliveries = LogoutDeliveryStore(pool: pool)
        let appID = groups.group(of: settings.appleClientID).primary
        let grants = GrantStore(pool: pool, appID: appID)
        sessions = SessionStore(pool: pool, appID: appID)
        authorization = AuthorizationService(
            settings: settings, appleBaseURL: appleBaseURL, clients: clients, grants: grants, sessions: sessions,
            signingKeys: keys, login: login, usedStates: WebSignInStore(pool: pool), keys: tokenKeys, metrics: metrics)
        // A client's jwks_uri answer is small: a transport of its own with that bound.
        let clientKeys = ClientKeys(
            transport: transport ?? CurlTransport(maximumResponseBytes: ClientKeys.maximumBytes),
            allowPrivateNetworks: allowPrivateNetworks)
        tokens = TokenService(
            endpoints: endpoints, clients: clients, grants: grants, users: UserDirectory(pool: pool, groups: groups), keys: keys,
            clientKeys: clientKeys,
            resourceServers: resourceServers, assertions: ClientAssertionStore(pool: pool), metrics: metrics)
        endSession = EndSessionService(
            issuer: settings.issuer, clients: clients, sessions: sessions, signingKeys: keys, tokenKeys: tokenKeys)
        checkOutboundURL = { try WebhookSubscriptionStore.validate(url: $0, allowPrivateNetworks: allowPrivateNetworks) }
    }

    /// Adds the provider's routes.
    /// - Parameter authorizeAdmin: checks an admin-scope API key (RFC 7591's initial access
    ///   token) and its per-key budget; returns the key (its reach is checked here).
    package func register(
        on router: inout Router, authorizeAdmin: @escaping @Sendable (HTTPRequest) throws -> APIKey, perAddress: RateLimiter
    ) {
        let admin = AdminAccess(authorize: authorizeAdmin, appleClientID: appleClientID)
        OpenIDRoutes.register(on: &router, provider: self, admin: admin, perAddress: perAddress)
        AdminRoutes.register(on: &router, provider: self, admin: admin)
    }

    /// The provider's answer to a request for one of its endpoints that the HTTP server refused
    /// before routing (a body over the limit), in the endpoint's RFC format; nil: not its own.
    package func refusal(_ problem: Problem, _ request: HTTPRequest) -> HTTPResponse? {
        OpenIDRoutes.refusal(problem, request, endpoints: endpoints)
    }

    /// OpenID Connect Discovery 1.0 §3 and RFC 8414 §2 (one document).
    var discoveryDocument: JSONValue {
        func strings(_ values: [String]) -> JSONValue { .array(values.map(JSONValue.string)) }
        return .object([
            "issuer": .string(endpoints.issuer),
            "authorization_endpoint": .string(endpoints.url(Endpoints.authorize)),
            "token_endpoint": .string(endpoints.url(Endpoints.token)),
            "userinfo_endpoint": .string(endpoints.url(Endpoints.userinfo)),
            "jwks_uri": .string(endpoints.url(Endpoints.jwks)),
            "registration_endpoint": .string(endpoints.url(Endpoints.registration)),
            "revocation_endpoint": .string(endpoints.url(Endpoints.revocation)),
            "end_session_endpoint": .string(endpoints.url(Endpoints.endSession)),
            "introspection_endpoint": .string(endpoints.url(Endpoints.introspection)),
            "response_types_supported": strings(["code"]),
            "response_modes_supported": strings(["query", "form_post"]),
            "grant_types_supported": strings(["authorization_code", "refresh_token"]),
            "subject_types_supported": strings(["public"]),
            "id_token_signing_alg_values_supported": strings(["RS256"]),
            "code_challenge_methods_supported": strings(["S256"]),
            "token_endpoint_auth_methods_supported": strings([
                "client_secret_basic", "client_secret_post", "private_key_jwt", "none",
            ]),
            "token_endpoint_auth_signing_alg_values_supported": strings(["RS256", "ES256"]),
            "revocation_endpoint_auth_methods_supported": strings([
                "client_secret_basic", "client_secret_post", "private_key_jwt", "none",
            ]),
            "revocation_endpoint_auth_signing_alg_values_supported": strings(["RS256", "ES256"]),
            "introspection_endpoint_auth_methods_supported": strings(["client_secret_basic", "client_secret_post"]),
            "scopes_supported": strings(["openid", "email", "profile", "offline_access"]),
            "claims_supported": strings([
                "iss", "sub", "aud", "iat", "exp", "auth_time", "nonce", "at_hash", "sid", "email", "email_verified",
                "is_private_email", "email_forwarding", "name", "given_name", "family_name", "preferred_username",
            ]),
            "prompt_values_supported": strings(["none", "login", "consent", "select_account"]),
            "authorization_response_iss_parameter_supported": .bool(true),
            "backchannel_logout_supported": .bool(true),
            "backchannel_logout_session_supported": .bool(true),
            "request_parameter_supported": .bool(false),
            "request_uri_parameter_supported": .bool(false),
        ])
    }
}
