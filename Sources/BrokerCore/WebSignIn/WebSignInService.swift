import AppleID
import BrokerCrypto
import Foundation
import HTTPClient
import Observability
import StrictJSON

/// Sign in with Apple on the web, through the broker (protocol reference §7):
///
/// 1. `authorize` seals what the callback needs (client id, `return_to`, `app_state`, a
///    nonce, an expiry) into the `state` itself (`WebSignInState`; no cookie, so Apple's
///    cross-site form POST cannot lose it, P6; no row, so calling it costs nothing) and sends
///    the browser to Apple with `response_type=code id_token`, `response_mode=form_post`,
///    `scope=name email`;
/// 2. `callback` takes Apple's form post: opens the state, logs the user in exactly as
///    `POST /v1/apple/login` does (token and nonce verified, then the state spent once, then
///    the code exchanged with the `redirect_uri` and the user upserted, keeping the unsigned
///    name Apple sends once, P7) and sends the browser to the registered `return_to` with a
///    one-time `result_code`, or with `error`;
/// 3. `redeem` gives the app backend the login answer for that code, once.
///
/// Browsers only ever go to Apple or to a `return_to` registered for the client id.
package final class WebSignInService: Sendable {
    let settings: BrokerConfiguration.WebSignInSettings?
    let appleBaseURL: String
    let store: WebSignInStore
    let login: LoginService
    let keys: TokenKeyRing
    /// Other sign-ins whose Apple form posts come back to this callback (the OpenID Provider).
    let continuations: [any AppleFormPostContinuation]
    private let outcomes: CounterFamily

    package init(
        settings: BrokerConfiguration.WebSignInSettings?, appleBaseURL: String, store: WebSignInStore, login: LoginService,
        keys: TokenKeyRing, metrics: MetricsRegistry, continuations: [any AppleFormPostContinuation] = []
    ) {
        self.continuations = continuations
        self.settings = settings
        self.appleBaseURL = appleBaseURL
        self.store = store
        self.login = login
        self.keys = keys
        outcomes = metrics.counter(
            "web_signin_total", help: "Web sign-in callbacks by outcome: success or the error sent to return_to.",
            labels: ["outcome"])
    }

    static let notConfigured = BrokerError(
        .webSignInNotConfigured, "set BROKER_PUBLIC_URL and APPLE_WEB_RETURN_URLS to sign in on the web through the broker")

    static let invalidState = BrokerError(.invalidState, "the state is unknown, already used or expired")

    /// A started sign-in: where the browser goes, and the secret its cookie must carry back.
    package struct Authorization: Sendable {
        /// Apple's authorization page.
        package let location: String
        /// Binds the state to this browser: the callback needs it back (login CSRF does not
        /// then rest on the app checking the optional `app_state`).
        package let browserBinding: String
        /// How long the binding is needed: the state's lifetime.
        package let lifetime: Duration
    }

    /// Starts a sign-in: Apple's authorization page, and the browser's binding.
    package func authorize(clientID: String?, returnTo: String?, appState: String?) throws -> Authorization {
        guard let settings else { throw Self.notConfigured }
        guard let clientID, !clientID.isEmpty else { throw BrokerError.invalidRequest("query parameter `client_id` is required") }
        guard let returnTo, !returnTo.isEmpty else { throw BrokerError.invalidRequest("query parameter `return_to` is required") }
        guard let registered = settings.returnURLs[clientID] else {
            throw BrokerError(.webClientUnknown, "\(clientID) is not a client id configured for web sign-in")
        }
        // Exact match only: anything else would make the broker an open redirect.
        guard registered.contains(returnTo) else {
            throw BrokerError(.returnToNotRegistered, "return_to is not registered for this client id")
        }
        if let appState, appState.utf8.count > 512 { throw BrokerError.invalidRequest("`app_state` is longer than 512 bytes") }
        let rawNonce = Base64URL.encode(SecureRandom.bytes(32))
        let binding = Base64URL.encode(SecureRandom.bytes(32))
        let state = try WebSignInState(
            clientID: clientID, returnTo: returnTo, appState: appState, rawNonce: rawNonce,
            expiresAt: Int(Date().timeIntervalSince1970) + Int(settings.stateLifetime.components.seconds),
            browser: SHA256.hexHash(binding)
        ).sealed(with: keys)
        let location =
            appleBaseURL + "/auth/authorize?"
            + Self.query([
                ("client_id", clientID), ("redirect_uri", settings.callbackURL), ("response_type", "code id_token"),
                ("response_mode", "form_post"), ("scope", "name email"), ("state", state),
                ("nonce", SHA256.hexHash(rawNonce)),
            ])
        return Authorization(location: location, browserBinding: binding, lifetime: settings.stateLifetime)
    }

    /// Where a browser that met an error can go back to: the `return_to` of a state this
    /// broker sealed, or a `return_to` given with its client id, when it is registered now.
    package func returnTo(state: String?, clientID: String?, returnTo: String?) -> String? {
        guard let settings else { return nil }
        if let state, let opened = WebSignInState.open(state, keys: keys) {
            return settings.returnURLs[opened.clientID]?.contains(opened.returnTo) == true ? opened.returnTo : nil
        }
        if let clientID, let returnTo {
            return settings.returnURLs[clientID]?.contains(returnTo) == true ? returnTo : nil
        }
        return state == nil ? onlyReturnURL : nil
    }

    /// The return URL when exactly one is registered for all client ids: where a callback
    /// without a state can still send the browser.
    var onlyReturnURL: String? {
        let all = Set(settings?.returnURLs.values.flatMap { $0 } ?? [])
        return all.count == 1 ? all.first : nil
    }

    /// Handles Apple's form post and answers the browser's next step: another sign-in's
    /// (a continuation's) for its states, else the web sign-in's redirect to `return_to`.
    package func callback(form fields: [String: String], cookies: [String: String]) throws -> CallbackAnswer {
        if let state = fields["state"], let continuation = continuations.first(where: { state.hasPrefix($0.statePrefix) }) {
            return try continuation.callback(form: fields, cookies: cookies)
        }
        return CallbackAnswer(.redirect(try callback(form: fields, browserBinding: cookies[Self.bindingCookie])))
    }

    /// Binds a sign-in's state to the browser that started it. `__Host-`: only over HTTPS,
    /// for this host alone (no Domain), for every path.
    package static let bindingCookie = "__Host-abk_signin"

    /// The web sign-in's own callback: where the browser goes next.
    package func callback(form fields: [String: String], browserBinding: String?) throws -> String {
        guard let settings else { throw Self.notConfigured }
        guard let stateText = fields["state"], !stateText.isEmpty else {
            // Whether Apple sends `state` with a cancel is unconfirmed (protocol reference
            // §10.6, from "Incorporating Sign in with Apple into other platforms"): a cancel
            // without one still goes back to the app when there is only one place to go.
            if let error = fields["error"], let only = onlyReturnURL {
                let code = Self.appleErrors.contains(error) ? error : "apple_error"
                outcomes.increment(code)
                return only + (only.contains("?") ? "&" : "?") + Self.query([("error", code)])
            }
            throw BrokerError(.invalidState, "the callback carries no state")
        }
        guard let authorization = WebSignInState.open(stateText, keys: keys), !authorization.isExpired,
            settings.returnURLs[authorization.clientID]?.contains(authorization.returnTo) == true
        else { throw Self.invalidState }
        // Only the browser that started the sign-in may finish it: a state posted from another
        // browser (an attacker's own sign-in, to log the victim into the attacker's account)
        // lacks its cookie. States of the previous release carry no binding.
        if let bound = authorization.browser {
            let presented = browserBinding.map { Array(SHA256.hexHash($0).utf8) } ?? []
            guard ConstantTime.equals(presented, Array(bound.utf8)) else {
                outcomes.increment("invalid_state")
                throw Self.invalidState
            }
        }
        func finish(_ outcome: String, _ parameters: [(String, String)]) -> String {
            outcomes.increment(outcome)
            let carried = parameters + (authorization.appState.map { [("app_state", $0)] } ?? [])
            return authorization.returnTo + (authorization.returnTo.contains("?") ? "&" : "?") + Self.query(carried)
        }
        if let error = fields["error"] {
            // Apple's own error (the user cancelled): passed on when it is one Apple sends,
            // so a forged post cannot invent redirect parameters or metric labels.
            let code = Self.appleErrors.contains(error) ? error : "apple_error"
            return finish(code, [("error", code)])
        }
        guard let idToken = fields["id_token"], let code = fields["code"], !idToken.isEmpty, !code.isEmpty else {
            return finish("invalid_request", [("error", "invalid_request")])
        }
        let response: LoginResponse
        switch try FormPostLogin(login: login, usedStates: store).signIn(
            idToken: idToken, code: code, userField: fields["user"], rawNonce: authorization.rawNonce,
            clientID: authorization.clientID, callbackURL: settings.callbackURL, state: stateText,
            stateExpiresAt: authorization.expiresAt)
        {
        case .signedIn(let signedIn, _): response = signedIn
        case .stateAlreadyUsed:
            outcomes.increment("invalid_state")
            throw Self.invalidState
        case .failed(let code, _, _): return finish(code, [("error", code)])
        }
        let result = try store.createResult(
            response.json, clientID: authorization.clientID, userID: response.userID.uuidString.lowercased(),
            lifetime: settings.resultLifetime)
        return finish("success", [("result_code", result)])
    }

    /// The login answer for a result code, once.
    package func redeem(_ code: String, by key: APIKey) throws -> JSONValue {
        guard settings != nil else { throw Self.notConfigured }
        // A key limited to other apps may not take this sign-in's answer (nor spend its code).
        if key.reach != nil, code.utf8.count <= 256, let clientID = try store.clientID(ofResult: code), !key.reaches(clientID) {
            throw BrokerError.clientNotAllowed(clientID)
        }
        guard code.utf8.count <= 256, let response = try store.redeem(code) else {
            throw BrokerError(.resultCodeInvalid, "the result code is unknown, already redeemed or expired")
        }
        return response
    }

    /// The errors Apple's authorization page reports (OAuth 2.0 §4.1.2.1 and Apple's cancel).
    package static let appleErrors: Set<String> = [
        "user_cancelled_authorize", "access_denied", "invalid_request", "invalid_client", "invalid_scope",
        "unsupported_response_type", "unauthorized_client", "server_error", "temporarily_unavailable",
    ]

    /// Login problems that come after the identity token verified: Apple could not exchange the code.
    package static var exchangeFailures: Set<BrokerError.Code> { LoginService.exchangeFailures }

    /// A query string, with spaces as %20 (Apple's documented form for `scope`).
    package static func query(_ fields: [(String, String)]) -> String {
        fields.map { FormEncoding.escape($0.0) + "=" + FormEncoding.escape($0.1).replacingOccurrences(of: "+", with: "%20") }
            .joined(separator: "&")
    }
}
