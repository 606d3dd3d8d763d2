import Foundation
import HTTPServer
import Observability
import StrictJSON

/// Sign-in and step-up through the organisation's OpenID Connect provider: `/login/oidc`
/// starts it with a GET (a form POST redirecting to another origin is blocked by
/// `form-action 'self'` in Chromium), `/callback` ends it with a 200 page that moves on by
/// itself: after the provider's cross-site redirect a `SameSite=Strict` cookie set on a
/// redirect is not sent on the next hop, but it is after this page's own navigation.
struct OIDCPages {
    let client: OIDCClient
    let sessions: ConsoleSessionStore
    let stepUpWindow: Duration
    /// Sign-ins started per client address: each stores a transaction, and anyone can start one.
    let starts: RateLimiter
    let logger: Logger

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
        return HTTPResponse(status: 303, headers: ["Location": url])
    }

    func callback(_ request: ConsoleRequest) throws -> HTTPResponse {
        let query = request.http.query
        guard let state = query["state"], let transaction = try sessions.takeOIDC(state: state) else {
            return refused("unknown or expired state")
        }
        guard let code = query["code"], !code.isEmpty, code.utf8.count <= 2048 else {
            return refused("no code (\(String((query["error"] ?? "none").prefix(40))))")
        }
        let identity: OIDCIdentity
        do {
            identity = try client.identity(
                code: code, verifier: transaction.verifier, nonce: transaction.nonce,
                maximumAge: transaction.stepUpOf == nil ? nil : Double(stepUpWindow.components.seconds))
        } catch let failure as OIDCFailure {
            return refused(failure.description)
        } catch {
            return refused("\(type(of: error))")
        }
        if let stepUpOf = transaction.stepUpOf {
            // A step-up renews the session it was started from, for the same operator only.
            let ended = try sessions.endSession(hash: stepUpOf)
            guard ended.ended, ended.operatorID == identity.subject else {
                return refused("step-up by another operator, or the session ended")
            }
        }
        // Whatever session the browser still holds ends too (Chromium sends the Strict cookie
        // after the provider's redirect; the step-up's own session is already ended above).
        if let previous = request.session, ConsoleSessionStore.hash(previous.secret) != transaction.stepUpOf {
            try sessions.end(secret: previous.secret)
        }
        let session = try sessions.open(
            operatorID: identity.subject, name: identity.displayName, roles: identity.roles, authTime: identity.authTime)
        try sessions.audit(
            actor: session.actor, action: transaction.stepUpOf == nil ? "console.signed_in" : "console.stepped_up",
            subject: session.actor, detail: ["roles": .string(session.roles.sorted().map(\.rawValue).joined(separator: ","))])
        var response = Layout.page(
            "Signed in", session: nil,
            head: "<meta http-equiv=\"refresh\" content=\"0;url=\(transaction.returnTo)\">",
            "<p>You are signed in.</p><p><a href=\"\(transaction.returnTo)\">Continue</a></p>")
        response.headers.add("Set-Cookie", ConsoleGate.setCookie(session))
        return response
    }

    private func refused(_ reason: String) -> HTTPResponse {
        logger.warning("console sign-in refused", [("reason", reason)])
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
