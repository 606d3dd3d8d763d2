import AppleID
import BrokerCore
import BrokerCrypto
import Foundation
import HTTPClient
import Observability
import StrictJSON

/// The authorization endpoint and its return from Apple (OpenID Connect Core §3.1.2, RFC 7636,
/// RFC 9207, RFC 9700): checks the RP's request; while the browser holds a live session at the
/// provider (OIDC_SESSION_SECONDS) that satisfies the request (`prompt`, `max_age`,
/// `id_token_hint`), answers at once with a code (single sign-on, silent renewal); otherwise
/// sends the browser to Apple with the broker's own state and nonce (`prompt=none` gets
/// `login_required` instead) and, on Apple's form post, signs the user in as the web sign-in
/// does (identity token and nonce verified, Apple's code exchanged and its refresh token
/// stored, the first authorization's name kept), starts or renews the session, then answers
/// the RP with a one-time code, in the query or as a form post (`response_mode=form_post`).
package final class AuthorizationService: AppleFormPostContinuation {
    let settings: BrokerConfiguration.OpenIDProviderSettings
    let appleBaseURL: String
    let clients: ClientStore
    let grants: GrantStore
    let sessions: SessionStore
    let signingKeys: SigningKeys
    let login: LoginService
    let usedStates: WebSignInStore
    let keys: TokenKeyRing
    private let outcomes: CounterFamily
    private let sessionOutcomes: CounterFamily

    package init(
        settings: BrokerConfiguration.OpenIDProviderSettings, appleBaseURL: String, clients: ClientStore, grants: GrantStore,
        sessions: SessionStore, signingKeys: SigningKeys, login: LoginService, usedStates: WebSignInStore,
        keys: TokenKeyRing, metrics: MetricsRegistry
    ) {
        self.settings = settings
        self.appleBaseURL = appleBaseURL
        self.clients = clients
        self.grants = grants
        self.sessions = sessions
        self.signingKeys = signingKeys
        self.login = login
        self.usedStates = usedStates
        self.keys = keys
        outcomes = metrics.counter(
            "oidc_authorizations_total",
            help: "OpenID sign-ins returning from Apple, by outcome: success or the error sent to the RP.",
            labels: ["outcome"])
        sessionOutcomes = metrics.counter(
            "oidc_session_authorizations_total",
            help:
                "Authorizations answered from a session at the provider without Apple (success), or prompt=none refused (login_required).",
            labels: ["outcome"])
    }

    package var statePrefix: String { PendingAuthorization.prefix }

    /// Session lifetime in seconds; 0: sessions are off.
    var sessionSeconds: Int { Int(settings.sessionLifetime.components.seconds) }

    /// What the authorize endpoint answers.
    package enum Outcome: Sendable, Equatable {
        /// Send the browser here (the RP in query mode).
        case redirect(String)
        /// Send the browser to Apple, with the cookie (BrowserBinding) its return must carry.
        case apple(location: String, bindingCookie: String)
        /// The RP's answer as an auto-submitting form (`response_mode=form_post`).
        case formPost(headers: [String: String], html: String)
        /// No trustworthy redirect URI: a page, never a redirect (RFC 6749 §4.1.2.1).
        case page(status: Int, title: String, message: String)
    }

    /// The answer to the relying party in its response mode.
    func outcome(_ response: AuthorizationResponse) -> Outcome {
        switch response.mode {
        case .query: return .redirect(response.location)
        case .formPost:
            let page = response.page
            return .formPost(headers: page.headers, html: page.html)
        }
    }

    /// Checks an authorization request (its query parameters).
    /// `repeated`: the names sent more than once (RFC 6749 §3.1: "MUST NOT be included more
    /// than once"); a repeated client_id or redirect_uri leaves no redirect to trust.
    /// `sessionSecret`: the browser's session cookie, if any; `bindingSecret`: its binding
    /// cookie (BrowserBinding), if any.
    package func authorize(
        _ parameters: [String: String], repeated: Set<String> = [], sessionSecret: String? = nil,
        bindingSecret: String? = nil
    ) throws -> Outcome {
        // RFC 6749 §3.1: a parameter sent without a value is treated as omitted.
        let query = parameters.filter { !$0.value.isEmpty }
        guard repeated.isDisjoint(with: ["client_id", "redirect_uri"]) else {
            return .page(
                status: 400, title: "Sign-in cannot continue",
                message: "The application sent client_id or redirect_uri more than once. Tell the application's team.")
        }
        guard let clientID = query["client_id"], !clientID.isEmpty, let client = try clients.find(clientID) else {
            return .page(
                status: 400, title: "Unknown application",
                message: "The application asking you to sign in is not registered here.")
        }
        guard let redirectURI = query["redirect_uri"], RedirectURIRule.matches(redirectURI, client.metadata.redirectURIs)
        else {
            return .page(
                status: 400, title: "Sign-in cannot continue",
                message: "The application's redirect_uri is not registered. Tell the application's team.")
        }
        let state = query["state"]
        // Until response_mode is known to be good, errors go in the query.
        var mode = ResponseMode.query
        func refuse(_ error: String, _ description: String, state: String?) -> Outcome {
            outcome(response(to: redirectURI, [("error", error), ("error_description", description)], state: state, mode: mode))
        }
        guard !query.values.contains(where: { $0.utf8.contains(0) }) else {
            // No database text holds a NUL byte (the nonce and redirect_uri are stored with the code).
            return refuse("invalid_request", "a parameter holds a NUL byte", state: nil)
        }
        if !repeated.isEmpty {
            // The names are the sender's text: not echoed (error_description's character rules).
            return refuse(
                "invalid_request", "a parameter is sent more than once", state: repeated.contains("state") ? nil : state)
        }
        if let state, state.utf8.count > ProviderPolicy.maximumStateBytes {
            return refuse("invalid_request", "state is longer than 512 bytes", state: nil)
        }
        if let requested = query["response_mode"] {
            guard let known = ResponseMode(rawValue: requested) else {
                return refuse("invalid_request", "response_mode: query or form_post", state: state)
            }
            mode = known
        } else if let request = query["request"], let inside = Self.responseMode(inRequestObject: request) {
            // Request objects are refused (request_not_supported), but in the response mode the
            // RP asked for inside one: it waits for a form post (OpenID Connect Core §6.1 puts
            // every parameter there). Only where the refusal goes; nothing else is read from it.
            mode = inside
        }
        func refuse(_ error: String, _ description: String) -> Outcome { refuse(error, description, state: state) }
        guard let responseType = query["response_type"] else { return refuse("invalid_request", "response_type is required") }
        guard responseType == "code" else {
            return refuse("unsupported_response_type", "only the authorization code flow (response_type=code)")
        }
        if query["request"] != nil || query["request_uri"] != nil {
            return refuse(
                query["request"] != nil ? "request_not_supported" : "request_uri_not_supported",
                "request objects are not supported")
        }
        // OpenID Connect Core §3.1.2.1: scope values not understood are ignored (RPs add their
        // own, such as `groups`); known ones the client did not register are invalid_scope.
        var scopes: [String] = []
        for scope in (query["scope"] ?? "").split(separator: " ").map(String.init)
        where ProviderPolicy.scopes.contains(scope) && !scopes.contains(scope) {
            scopes.append(scope)
        }
        // OpenID Connect Core §11: offline_access that cannot be granted is ignored, not refused
        // (RPs such as oauth2-proxy ask for it whatever the registration says).
        if !client.metadata.grantTypes.contains("refresh_token") || !client.metadata.scopes.contains("offline_access") {
            scopes.removeAll { $0 == "offline_access" }
        }
        guard scopes.contains("openid") else { return refuse("invalid_scope", "scope must contain openid") }
        guard Set(scopes).isSubset(of: client.metadata.scopes) else {
            return refuse("invalid_scope", "scope may hold only " + client.metadata.scope)
        }
        let nonce = query["nonce"]
        if let nonce, nonce.isEmpty || nonce.utf8.count > ProviderPolicy.maximumNonceBytes {
            return refuse("invalid_request", "nonce: 1 to 256 bytes")
        }
        let challenge = query["code_challenge"]
        if let challenge {
            // RFC 7636 §4.2: 43 to 128 characters; S256 only (RFC 9700 §2.1.1: plain refused).
            guard query["code_challenge_method"] == "S256" else {
                return refuse("invalid_request", "code_challenge_method must be S256")
            }
            guard CodeChallenge.isWellFormed(challenge) else {
                return refuse("invalid_request", "code_challenge must be 43 to 128 URL-safe characters")
            }
        } else if client.metadata.isPublic {
            return refuse("invalid_request", "public clients must send a PKCE code_challenge (S256)")
        } else if query["code_challenge_method"] != nil {
            return refuse("invalid_request", "code_challenge_method without code_challenge")
        }
        let prompts = Set((query["prompt"] ?? "").split(separator: " ").map(String.init))
        // OpenID Connect Core §3.1.2.1: `none` with any other value is an error.
        if prompts.contains("none"), prompts.count > 1 { return refuse("invalid_request", "prompt=none cannot be combined") }
        var maxAge: Int?
        if let text = query["max_age"] {
            guard let value = Int(text), value >= 0 else { return refuse("invalid_request", "max_age: a number of seconds") }
            maxAge = min(value, ProviderPolicy.maximumMaxAgeSeconds)
        }
        var hint: IDTokenHint?
        if let text = query["id_token_hint"] {
            guard let verified = IDTokenHint.verify(text, keys: signingKeys, issuer: settings.issuer),
                verified.audiences.contains(client.clientID)
            else { return refuse("invalid_request", "id_token_hint is not an ID token this provider issued to the client") }
            hint = verified
        }
        let scope = scopes.joined(separator: " ")
        // A session answers at once unless the RP asks for Apple's page (login, consent,
        // account choice), the session is older than max_age, or the hint names someone else.
        let session = try sessionSeconds > 0 ? sessionSecret.flatMap { try sessions.find(secret: $0) } : nil
        if let session, prompts.isDisjoint(with: ["login", "consent", "select_account"]),
            maxAge.map({ Date().timeIntervalSince(session.authTime) <= Double($0) }) ?? true,
            hint.map({ $0.sub == session.userID.uuidString.lowercased() }) ?? true
        {
            let code = try grants.createCode(
                clientID: client.clientID, userID: session.userID, scope: scope, redirectURI: redirectURI,
                codeChallenge: challenge, nonce: nonce,
                authentication: .init(
                    sessionID: session.id, sid: session.sid, authTime: session.authTime, logoutUntil: session.expiresAt))
            sessionOutcomes.increment("success")
            return outcome(response(to: redirectURI, [("code", code)], state: state, mode: mode))
        }
        if prompts.contains("none") {
            sessionOutcomes.increment("login_required")
            return refuse("login_required", "the user must sign in with Apple")
        }
        let appleNonce = Base64URL.encode(SecureRandom.bytes(32))
        let binding = BrowserBinding.secret(reusing: bindingSecret)
        let pending = PendingAuthorization(
            clientID: client.clientID, redirectURI: redirectURI, state: state, nonce: nonce, codeChallenge: challenge,
            scope: scope, responseMode: mode, appleNonce: appleNonce,
            expiresAt: Int(Date().timeIntervalSince1970) + ProviderPolicy.stateLifetimeSeconds,
            browser: BrowserBinding.hash(binding))
        // Apple's name and email scopes only when the RP asked for the matching claims; with
        // any scope Apple requires response_mode=form_post (TN3107).
        let appleScopes = (scopes.contains("profile") ? ["name"] : []) + (scopes.contains("email") ? ["email"] : [])
        var parameters: [(String, String)] = [
            ("client_id", settings.appleClientID), ("redirect_uri", settings.callbackURL),
            ("response_type", "code id_token"), ("response_mode", "form_post"),
        ]
        if !appleScopes.isEmpty { parameters.append(("scope", appleScopes.joined(separator: " "))) }
        parameters += [("state", try pending.sealed(with: keys)), ("nonce", SHA256.hexHash(appleNonce))]
        return .apple(
            location: appleBaseURL + "/auth/authorize?" + WebSignInService.query(parameters),
            bindingCookie: BrowserBinding.set(binding, maxAgeSeconds: ProviderPolicy.stateLifetimeSeconds))
    }

    /// The `response_mode` inside an unverified request object (`header.payload.signature`), if
    /// it is one we answer in; anything else (too long, not a JWT, no such member) is nil.
    static func responseMode(inRequestObject request: String) -> ResponseMode? {
        guard request.utf8.count <= 8192 else { return nil }
        let parts = request.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let payload = Base64URL.decode(parts[1]),
            case .object(let members)? = try? JSONValue.parse(payload)
        else { return nil }
        return members["response_mode"]?.stringValue.flatMap(ResponseMode.init(rawValue:))
    }

    /// The answer to the RP: its parameters, its `state` and our `iss` (RFC 9207).
    func response(to redirectURI: String, _ parameters: [(String, String)], state: String?, mode: ResponseMode)
        -> AuthorizationResponse
    {
        AuthorizationResponse(redirectURI: redirectURI, parameters, state: state, issuer: settings.issuer, mode: mode)
    }

    /// Apple's form post for one of our states: the browser's next step (the RP, in its
    /// response mode) and, after a sign-in, the session cookie.
    package func callback(form fields: [String: String], cookies: [String: String]) throws -> CallbackAnswer {
        guard let text = fields["state"], let pending = PendingAuthorization.open(text, keys: keys), !pending.isExpired,
            let client = try clients.find(pending.clientID),
            RedirectURIRule.matches(pending.redirectURI, client.metadata.redirectURIs)
        else { throw BrokerError(.invalidState, "the state is unknown, already used or expired") }
        // Only the browser that started the authorization may finish it (BrowserBinding).
        if let bound = pending.browser, !BrowserBinding.matches(cookies[BrowserBinding.name], hash: bound) {
            outcomes.increment("invalid_state")
            throw BrokerError(.invalidState, "the state is unknown, already used or expired")
        }
        func finish(_ outcome: String, _ parameters: [(String, String)], cookies: [String] = []) -> CallbackAnswer {
            outcomes.increment(outcome)
            let answer = self.response(
                to: pending.redirectURI, parameters, state: pending.state, mode: pending.responseMode)
            switch answer.mode {
            case .query: return CallbackAnswer(.redirect(answer.location), cookies: cookies)
            case .formPost:
                let page = answer.page
                return CallbackAnswer(.page(status: 200, headers: page.headers, html: page.html), cookies: cookies)
            }
        }
        if let error = fields["error"] {
            // The user cancelled at Apple (`user_cancelled_authorize`), or Apple refused.
            return finish(
                "access_denied",
                [
                    ("error", "access_denied"),
                    (
                        "error_description",
                        error == "user_cancelled_authorize" ? "the user cancelled" : "Apple refused the sign-in"
                    ),
                ])
        }
        guard let idToken = fields["id_token"], let code = fields["code"], !idToken.isEmpty, !code.isEmpty else {
            return finish("server_error", [("error", "server_error"), ("error_description", "Apple's answer was incomplete")])
        }
        let response: LoginResponse
        let authenticatedAt: Date
        switch try FormPostLogin(login: login, usedStates: usedStates).signIn(
            idToken: idToken, code: code, userField: fields["user"], rawNonce: pending.appleNonce,
            clientID: settings.appleClientID, callbackURL: settings.callbackURL, state: text, stateExpiresAt: pending.expiresAt)
        {
        case .signedIn(let signedIn, let at):
            response = signedIn
            authenticatedAt = at
        case .stateAlreadyUsed:
            outcomes.increment("invalid_state")
            throw BrokerError(.invalidState, "the state is unknown, already used or expired")
        case .failed(let code, let rejected, let brokerCode):
            if rejected {
                return finish(code, [("error", "access_denied"), ("error_description", "Apple's answer was refused")])
            }
            let error = brokerCode == .appleUnavailable ? "temporarily_unavailable" : "server_error"
            return finish(code, [("error", error), ("error_description", "the sign-in with Apple failed")])
        }
        // The session at the provider: started, or renewed for this browser (a new secret).
        var setCookies: [String] = []
        let authentication: GrantStore.Authentication
        if sessionSeconds > 0 {
            let (session, secret) = try sessions.signedIn(
                userID: response.userID, authTime: authenticatedAt, lifetimeSeconds: sessionSeconds,
                previousSecret: cookies[SessionCookie.name])
            setCookies.append(SessionCookie.set(secret, maxAgeSeconds: sessionSeconds))
            authentication = .init(
                sessionID: session.id, sid: session.sid, authTime: session.authTime, logoutUntil: session.expiresAt)
        } else {
            authentication = .init(
                sessionID: nil, sid: Base64URL.encode(SecureRandom.bytes(16)), authTime: authenticatedAt,
                logoutUntil: Date().addingTimeInterval(TimeInterval(ProviderPolicy.sessionlessLogoutSeconds)))
        }
        let issued = try grants.createCode(
            clientID: client.clientID, userID: response.userID, scope: pending.scope, redirectURI: pending.redirectURI,
            codeChallenge: pending.codeChallenge, nonce: pending.nonce, authentication: authentication)
        return finish("success", [("code", issued)], cookies: setCookies)
    }
}
