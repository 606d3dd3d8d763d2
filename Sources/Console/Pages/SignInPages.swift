import Foundation
import HTTPServer

/// Signing in and out: `/login`, the single-use links of `appleid-broker console link`
/// (`/link`), `/step-up` and `/logout`. The OpenID Connect pages are `OIDCPages`.
struct SignInPages {
    let sessions: ConsoleSessionStore
    /// Link redemptions per client address (guessing a 256-bit token is hopeless; this
    /// keeps the attempt from costing the database). A link that signs in gives its token
    /// back: only wrong tokens spend the budget, so operators signing in often are never held up.
    let redemptions: RateLimiter
    let oidcConfigured: Bool
    let failures: SignInFailures

    func signIn(_ request: ConsoleRequest) throws -> HTTPResponse {
        let body: HTML =
            oidcConfigured
            ? "<p><a href=\"/login/oidc\">Sign in with your organisation’s account</a></p>"
            : """
            <p>Sign-in through an identity provider is not configured (CONSOLE_OIDC_ISSUER).</p>
            <p class="hint">Ask an administrator for a single-use sign-in link:
            <code>appleid-broker console link --operator NAME --role ROLE[,ROLE…] --ttl 15m</code>.</p>
            """
        return Layout.page("Sign in", session: nil, body)
    }

    /// The link's landing page: a form, not a sign-in, so a link preview (a chat app, a mail
    /// scanner fetching the URL) cannot use the link up.
    func linkForm(_ request: ConsoleRequest) throws -> HTTPResponse {
        let token = String((request.http.query["token"] ?? "").prefix(64))
        return Layout.page(
            "Sign in with a link", session: nil,
            """
            <p>This link signs you in once. It cannot be used again.</p>
            <form method="post" action="/link"><input type="hidden" name="token" value="\(token)">
            <button type="submit">Sign in</button></form>
            """)
    }

    func redeem(_ request: ConsoleRequest) throws -> HTTPResponse {
        if let refused = Layout.overBudget(redemptions, request) { return refused }
        guard let token = request.form["token"], let link = try sessions.redeemLink(token: token) else {
            failures.record(method: "link", reason: "link_not_valid")
            return Layout.refusal(
                403, "Link not valid", "This sign-in link is unknown, used already or expired. Ask for a new one.",
                session: nil)
        }
        redemptions.refund(RateLimiter.addressKey(request.http.remoteAddress))
        // A new session id at every sign-in; whatever session the browser had ends.
        if let previous = request.session { try sessions.end(secret: previous.secret) }
        let session = try sessions.open(operatorID: link.operatorID, name: link.operatorID, roles: link.roles, authTime: Date())
        return Layout.redirect("/", cookie: ConsoleGate.setCookie(session))
    }

    /// Without an identity provider there is nothing to re-run: a link session is fresh for
    /// five minutes after it was redeemed, then a new link is the step-up.
    func stepUp(_ request: ConsoleRequest) throws -> HTTPResponse {
        _ = try request.signedIn
        return Layout.page(
            "Confirm it is you", session: request.session,
            """
            <p>This action needs a sign-in from the last five minutes.</p>
            <p class="hint">Ask an administrator for a new single-use sign-in link, then open this page again.</p>
            """)
    }

    func signOut(_ request: ConsoleRequest) throws -> HTTPResponse {
        let session = try request.signedIn
        try sessions.end(secret: session.secret)
        return Layout.redirect("/login", cookie: ConsoleGate.clearCookie)
    }
}
