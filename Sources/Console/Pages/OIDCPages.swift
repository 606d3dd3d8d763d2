import BrokerCrypto
import Foundation
import HTTPServer
import Observability
import StrictJSON

/// Sign-in and step-up through the organisation's OpenID Connect provider: `/login/oidc`
/// starts it with a GET (a form POST redirecting to another origin is blocked by
/// `form-action 'self'` in Chromium), `/callback` ends it with a 200 page that moves on by
/// itself: after the provider's cross-site redirect a `SameSite=Strict` cookie set on a
/// redirect is not sent on the next hop, but it is after this page's own navigation.
///
/// A sign-in is bound to the browser that started it (login CSRF, issue 38 item 4): the start
/// sets the `__Host-console-oidc` cookie to the sign-in's `state`, and a callback whose `state`
/// is not that cookie's signs no one in, so a callback URL of someone else's sign-in, opened
/// in a victim's browser, does not sign the victim in as them. The cookie is `SameSite=Lax`
/// (it must come with the provider's cross-site redirect, a top-level GET), lives ten minutes
/// like the transaction, and every callback clears it.
struct OIDCPages {
    let client: OIDCClient
    let sessions: ConsoleSessionStore
    let stepUpWindow: Duration
    /// Sign-ins started per client address: each stores a transaction, and anyone can start one.
    let starts: RateLimiter
    let failures: SignInFailures
    let logger: Logger

    static let bindingCookie = "__Host-console-oidc"

    func start(_ request: ConsoleRequest) throws -> HTTPResponse {
        if let refused = Layout.overBudget(starts, request) { return refused }
        return try begin(returnTo: Self.safeReturn(request.http.query["next"]), stepUpOf: nil)
    }

    /// Re-runs the sign-in with `max_age` for the signed-in operator.
    func stepUp(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        return try begin(
            returnTo: Self.safeReturn(request.http.query["next"]), stepUpOf: ConsoleSessionStore.hash(session.secret))
    }

    private func begin(returnTo: String, stepUpOf: [UInt8]?) throws -> HTTPResponse {
        let nonce = ConsoleSessionStore.newSecret()
        let verifier = ConsoleSessionStore.newSecret()
        let state: String
        do {
            state = try sessions.beginOIDC(.init(nonce: nonce, verifier: verifier, returnTo: returnTo, stepUpOf: stepUpOf))
        } catch is ConsoleSessionStore.OIDCTransactionsFull {
            logger.warning("console sign-ins under way at their limit")
            var response = Layout.refusal(
                503, "Too many sign-ins", "Too many sign-ins are under way. Try again in a few minutes, or use a sign-in link.",
                session: nil)
            response.headers.set("Retry-After", "60")
            return response
        }
        let url: String
        do {
            url = try client.authorizationURL(state: state, nonce: nonce, verifier: verifier, stepUp: stepUpOf != nil)
        } catch let failure as OIDCFailure {
            logger.warning("console sign-in unavailable", [("reason", failure.description)])
            return Layout.refusal(
                503, "Sign-in unavailable", "The identity provider cannot be reached. Try again, or use a sign-in link.",
                session: nil)
        }
        var response = HTTPResponse(status: 303, headers: ["Location": url])
        response.headers.add("Set-Cookie", "\(Self.bindingCookie)=\(state); Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age=600")
        return response
    }

    func callback(_ request: ConsoleRequest) throws -> HTTPResponse {
        let query = request.http.query
        var response = try finish(request, query: query)
        response.headers.add("Set-Cookie", "\(Self.bindingCookie)=; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age=0")
        return response
    }

    private func finish(_ request: ConsoleRequest, query: [String: String]) throws -> HTTPResponse {
        guard let state = query["state"], !state.isEmpty else { return refused("state_missing", "no state") }
        // Checked before the transaction is taken: a callback from another browser neither signs
        // anyone in nor uses up the sign-in it names.
        guard let bound = ConsoleGate.cookie(Self.bindingCookie, request.http) else {
            return refused("browser_not_bound", "no sign-in was started in this browser")
        }
        guard ConstantTime.equals(Array(bound.utf8), Array(state.utf8)) else {
            return refused("browser_mismatch", "the state is not the one this browser started")
        }
        guard let transaction = try sessions.takeOIDC(state: state) else {
            return refused("state_unknown", "unknown or expired state")
        }
        let method = transaction.stepUpOf == nil ? "oidc" : "step_up"
        guard let code = query["code"], !code.isEmpty, code.utf8.count <= 2048 else {
            return refused("no_code", "no code (\(String((query["error"] ?? "none").prefix(40))))", method: method)
        }
        let identity: OIDCIdentity
        do {
            identity = try client.identity(
                code: code, verifier: transaction.verifier, nonce: transaction.nonce,
                maximumAge: transaction.stepUpOf == nil ? nil : Double(stepUpWindow.components.seconds))
        } catch let failure as OIDCFailure {
            if failure.code == "no_mapped_group", let subject = failure.subject {
                // The provider vouches for the operator, whose groups map to no role any more:
                // the sessions they still hold end now, not when they expire.
                let ended = try sessions.endSessions(operatorID: subject, oidcOnly: true)
                return refused(
                    failure.code, failure.description + (ended > 0 ? "; \(ended) session(s) ended" : ""), method: method,
                    operatorID: subject)
            }
            return refused(failure.code, failure.description, method: method)
        } catch {
            return refused("token_exchange", "\(type(of: error))", method: method)
        }
        if let stepUpOf = transaction.stepUpOf {
            // A step-up renews the session it was started from, for the same operator only.
            let ended = try sessions.endSession(hash: stepUpOf)
            guard ended.ended, ended.operatorID == identity.subject else {
                return refused(
                    "step_up_mismatch", "step-up by another operator, or the session ended", method: method,
                    operatorID: identity.subject)
            }
        }
        // Whatever session the browser still holds ends too (Chromium sends the Strict cookie
        // after the provider's redirect; the step-up's own session is already ended above).
        if let previous = request.session, ConsoleSessionStore.hash(previous.secret) != transaction.stepUpOf {
            try sessions.end(secret: previous.secret)
        }
        // The operator's other browsers follow what the provider says now.
        try sessions.follow(operatorID: identity.subject, groups: identity.groups, roles: identity.roles)
        let session = try sessions.open(
            operatorID: identity.subject, name: identity.displayName, roles: identity.roles, groups: identity.groups,
            authTime: identity.authTime)
        try sessions.audit(
            actor: session.actor, action: transaction.stepUpOf == nil ? "console.signed_in" : "console.stepped_up",
            target: "console_session", subject: session.actor,
            detail: ["roles": .string(session.roles.sorted().map(\.rawValue).joined(separator: ","))])
        var response = Layout.page(
            "Signed in", session: nil,
            head: "<meta http-equiv=\"refresh\" content=\"0;url=\(transaction.returnTo)\">",
            "<p>You are signed in.</p><p><a href=\"\(transaction.returnTo)\">Continue</a></p>")
        response.headers.add("Set-Cookie", ConsoleGate.setCookie(session))
        return response
    }

    /// 403, logged and audited (bounded, `SignInFailures`).
    private func refused(_ code: String, _ reason: String, method: String = "oidc", operatorID: String? = nil) -> HTTPResponse {
        failures.record(method: method, reason: code, operatorID: operatorID, detail: reason)
        var response = Layout.refusal(
            403, "Sign-in refused", "The identity provider’s answer was not accepted. Start again from the sign-in page.",
            session: nil)
        response.headers.set("X-Console-Refusal", "console_oidc_refused")
        return response
    }

    /// A path on the console only (`/…`, never `//host` or a scheme).
    static func safeReturn(_ next: String?) -> String {
        guard let next, next.hasPrefix("/"), !next.hasPrefix("//"), !next.contains("\\"), next.utf8.count <= 200,
            next.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7F })
        else { return "/" }
        return next
    }
}
