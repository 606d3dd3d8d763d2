import BrokerCore
import BrokerCrypto
import Foundation

/// The end-session endpoint (OpenID Connect RP-Initiated Logout 1.0): a relying party sends
/// the browser here to sign the person out at the provider. With an `id_token_hint` this
/// provider issued (signature and `iss` checked, `client_id` among its `aud`), the hint's
/// session ends at once, with every grant given in it (tokens stop working; the relying
/// parties with a `backchannel_logout_uri` get a Back-Channel Logout through the outbox), and
/// the browser goes to a `post_logout_redirect_uri` registered for that client, matched
/// exactly, with `state`. Without a hint the person is asked to confirm (§2: the OP SHOULD
/// ask; a page anyone can link to must not sign people out), and nobody is redirected (§3:
/// no post-logout redirection without a hint). A request that cannot be trusted gets a page,
/// never a redirect.
struct EndSessionService: Sendable {
    let issuer: String
    let clients: ClientStore
    let sessions: SessionStore
    let signingKeys: SigningKeys
    let tokenKeys: TokenKeyRing

    enum Outcome: Sendable, Equatable {
        /// Signed out: to the relying party's post-logout page.
        case redirect(String)
        /// Signed out (or nobody was): say so.
        case signedOut
        /// Ask the person; the form posts `token` back to the confirmation endpoint.
        case confirm(token: String)
        /// Not done: why, for the person.
        case refused(String)
    }

    /// Handles a logout request (`parameters`: the query or form; `repeated`: names sent more
    /// than once); `sessionSecret`: the browser's session cookie. Whether the browser's
    /// session ended (its cookie must go) is in the second value.
    func endSession(_ parameters: [String: String], repeated: Set<String>, sessionSecret: String?) throws -> (Outcome, Bool) {
        let query = parameters.filter { !$0.value.isEmpty }
        guard repeated.isEmpty else { return (.refused("The application sent a parameter more than once."), false) }
        guard !query.values.contains(where: { $0.utf8.contains(0) }) else {
            return (.refused("The application's sign-out request is malformed."), false)
        }
        if let state = query["state"], state.utf8.count > ProviderPolicy.maximumStateBytes {
            return (.refused("The application's sign-out request is malformed (state is too long)."), false)
        }
        let browser = try sessionSecret.flatMap { try sessions.find(secret: $0) }
        guard let text = query["id_token_hint"] else {
            // §2: without a hint, confirm with the person; nothing to end without a session.
            guard let browser else { return (.signedOut, sessionSecret != nil) }
            return (.confirm(token: confirmationToken(for: browser)), false)
        }
        guard let hint = IDTokenHint.verify(text, keys: signingKeys, issuer: issuer) else {
            return (.refused("The application's sign-out request carries an ID token this provider did not issue."), false)
        }
        if let clientID = query["client_id"], !hint.audiences.contains(clientID) {
            return (.refused("The application's sign-out request names another application than its ID token."), false)
        }
        var redirect: String?
        if let uri = query["post_logout_redirect_uri"] {
            // §3.1: registered for the client the hint was issued to, byte for byte.
            guard hint.audiences.count == 1, let client = try clients.find(hint.audiences[0]),
                client.metadata.postLogoutRedirectURIs.contains(uri)
            else {
                return (.refused("The address the application asked to return to after sign-out is not registered."), false)
            }
            redirect = uri
        }
        guard let userID = UUID(uuidString: hint.sub) else {
            return (.refused("The application's sign-out request carries an ID token this provider did not issue."), false)
        }
        if let sid = hint.sid { try sessions.end(sid: sid, userID: userID, reason: "rp_logout") }
        // The browser's own session, when it is the same person's under another sid.
        var browserEnded = browser?.sid == hint.sid && browser != nil
        if let browser, browser.userID == userID, browser.sid != hint.sid {
            try sessions.end(sid: browser.sid, userID: userID, reason: "rp_logout")
            browserEnded = true
        }
        guard let redirect else { return (.signedOut, browserEnded) }
        let location =
            query["state"].map { redirect + (redirect.contains("?") ? "&" : "?") + WebSignInService.query([("state", $0)]) }
            ?? redirect
        return (.redirect(location), browserEnded)
    }

    /// The person confirmed: ends the browser's session (when the form's token is the one its
    /// page carried). Whether the browser's session ended is in the second value.
    func confirm(token: String?, sessionSecret: String?) throws -> (Outcome, Bool) {
        guard let browser = try sessionSecret.flatMap({ try sessions.find(secret: $0) }) else {
            return (.signedOut, sessionSecret != nil)
        }
        guard let token, ConstantTime.equals(Array(token.utf8), Array(confirmationToken(for: browser).utf8)) else {
            return (.refused("This sign-out page has expired. Sign out again from the application."), false)
        }
        try sessions.end(sid: browser.sid, userID: browser.userID, reason: "logout_confirmed")
        return (.signedOut, true)
    }

    /// Binds a confirmation form to the session it ends (a cross-site form cannot know it).
    func confirmationToken(for session: SessionStore.Session) -> String {
        let key = tokenKeys.derivedKey("oidc-logout-confirmation") ?? []
        return Base64URL.encode(HMACSHA256.authenticate(Array(session.id.uuidString.utf8), key: key))
    }
}
