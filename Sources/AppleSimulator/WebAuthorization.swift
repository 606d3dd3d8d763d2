import BrokerCrypto
import Foundation
import HTTPServer
import Locking
import StrictJSON
import Synchronization

/// `GET /auth/authorize`: Apple's web sign-in page, played without a page. It checks the
/// request as Apple does (a registered client id, `response_mode=form_post` when `name` or
/// `email` is asked for) and, as if the user had consented, answers with the auto-submitting
/// form Apple's page posts to `redirect_uri`: `code`, `id_token`, `state`, and the unsigned
/// `user` JSON on the user's first authorization only.
///
/// Simulator-only parameters choose what the "user" does: `sim_sub` (sign in as this
/// existing user; default a new one, whose first authorization carries `user`),
/// `sim_cancel=1` (the user cancels: `error=user_cancelled_authorize`, with `state`),
/// `sim_cancel=nostate` (the same without `state`: whether Apple sends it on a cancel is
/// unconfirmed, protocol reference §10.6),
/// `sim_first_name`/`sim_last_name`, `sim_email` (a real address instead of a relay one),
/// `sim_managed=1` (a Managed Apple Account: `org_id` and a real address),
/// `sim_relay_domain` (`privaterelay.appleid.com` or `private.icloud.com`),
/// `sim_auth_age=N` (Apple's own session let the user through: `auth_time` is N seconds
/// before the token's `iat`, as in real tokens).
/// An existing user who stopped using Sign in with Apple for the app authorizes for the first
/// time again: `user` comes once more (`FaultSettings.userFieldAfterRevocation`).
extension AppleSimulator {
    func authorize(_ request: HTTPRequest) -> HTTPResponse {
        let query = request.query
        guard let clientID = query["client_id"], !clientID.isEmpty else {
            return errorPage("invalid_request", "client_id is missing")
        }
        let teamID = state.withLock { state in state.teams.values.first { $0.clientIDs.contains(clientID) }?.teamID }
        guard let teamID else { return errorPage("invalid_client", "unknown client_id") }
        guard let redirectURI = query["redirect_uri"], redirectURI.hasPrefix("https://") || Self.isLoopbackHTTP(redirectURI)
        else {
            return errorPage("invalid_request", "redirect_uri must be an https URL")
        }
        // Apple refuses a redirect_uri that is not a Return URL registered for the Services ID
        // (TN3107), and binds the code to it.
        guard isRegisteredReturnURL(redirectURI, clientID: clientID) else {
            return errorPage("invalid_request", "redirect_uri is not a Return URL registered for this client id")
        }
        let responseTypes = Set((query["response_type"] ?? "").split(separator: " ").map(String.init))
        guard responseTypes.contains("code"), responseTypes.isSubset(of: ["code", "id_token"]) else {
            return errorPage("unsupported_response_type", "response_type must be code or code id_token")
        }
        let scopes = Set((query["scope"] ?? "").split(separator: " ").map(String.init))
        guard scopes.isSubset(of: ["name", "email", "openid"]) else { return errorPage("invalid_scope", "unknown scope") }
        // Apple: "response_mode must be form_post when name or email scope is requested".
        guard query["response_mode"] == "form_post" else {
            return errorPage("invalid_request", "response_mode must be form_post when name or email scope is requested")
        }
        var fields: [(String, String)] = []
        if let state = query["state"] { fields.append(("state", state)) }
        if query["sim_cancel"] == "1" {
            return formPost(to: redirectURI, fields: [("error", "user_cancelled_authorize")] + fields)
        }
        if query["sim_cancel"] == "nostate" {
            return formPost(to: redirectURI, fields: [("error", "user_cancelled_authorize")])
        }
        let firstAuthorization: Bool
        let user: SimulatedUser
        if let sub = query["sim_sub"], let existing = self.user(teamID: teamID, sub: sub) {
            user = existing
            firstAuthorization =
                faults.userFieldAfterRevocation && consentRevoked(teamID: teamID, sub: sub, clientID: clientID)
        } else {
            let managed = query["sim_managed"] == "1"
            let relayDomain = query["sim_relay_domain"].flatMap { SimulatedUser.relayDomains.contains($0) ? $0 : nil }
            user = createUser(
                teamID: teamID,
                email: query["sim_email"] ?? (managed ? "m\(Int.random(in: 0..<1_000_000))@org.example" : nil),
                relayDomain: relayDomain, orgID: managed ? "org.\(Hex.encode(SecureRandom.bytes(4)))" : nil)
            firstAuthorization = true
        }
        let nonce = query["nonce"]
        let code = issueCode(teamID: teamID, sub: user.sub, clientID: clientID, redirectURI: redirectURI, nonce: nonce)
        var tokenRequest = TokenRequest(clientID: clientID)
        tokenRequest.nonceClaim = nonce
        tokenRequest.omitRealUserStatus = true
        if let age = query["sim_auth_age"].flatMap(Int.init), age >= 0 {
            tokenRequest.authTime = Int(Date().timeIntervalSince1970) - age
        }
        guard
            let idToken = try? identityToken(
                for: user, clientID: clientID, request: tokenRequest, code: code, accessToken: nil)
        else { return errorPage("server_error", "signing failed") }
        fields = [("code", code)] + (responseTypes.contains("id_token") ? [("id_token", idToken)] : []) + fields
        if firstAuthorization, !scopes.isEmpty {
            var member: [String: JSONValue] = [:]
            if scopes.contains("name") {
                member["name"] = .object([
                    "firstName": .string(query["sim_first_name"] ?? "Jane"),
                    "lastName": .string(query["sim_last_name"] ?? "Appleseed"),
                ])
            }
            if scopes.contains("email"), let email = user.email { member["email"] = .string(email) }
            fields.append(("user", String(decoding: JSONValue.object(member).serialized(), as: UTF8.self)))
        }
        return formPost(to: redirectURI, fields: fields)
    }

    /// Plain http to this machine: Apple accepts only https Return URLs (and no IP literals);
    /// the simulator lets loopback http through so the local demo runs without TLS.
    static func isLoopbackHTTP(_ url: String) -> Bool {
        ["http://127.0.0.1", "http://localhost", "http://[::1]"].contains {
            url == $0 || url.hasPrefix($0 + ":") || url.hasPrefix($0 + "/")
        }
    }

    /// The page Apple's browser flow ends with: a form that posts itself to `redirect_uri`.
    private func formPost(to url: String, fields: [(String, String)]) -> HTTPResponse {
        let inputs = fields.map { "<input type=\"hidden\" name=\"\(Self.html($0.0))\" value=\"\(Self.html($0.1))\">" }
        let page = """
            <!DOCTYPE html>
            <html><body onload="document.forms[0].submit()">
            <form method="post" action="\(Self.html(url))">\(inputs.joined())</form>
            </body></html>
            """
        return .text(page, contentType: "text/html; charset=utf-8")
    }

    private func errorPage(_ error: String, _ description: String) -> HTTPResponse {
        .text(
            "<!DOCTYPE html><html><body><h1>\(error)</h1><p>\(Self.html(description))</p></body></html>", status: 400,
            contentType: "text/html; charset=utf-8")
    }

    static func html(_ text: String) -> String { HTMLPage.escape(text) }
}
