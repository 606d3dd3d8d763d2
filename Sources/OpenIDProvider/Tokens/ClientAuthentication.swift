import BrokerCrypto
import Foundation
import HTTPClient
import HTTPServer

/// Who calls the token and revocation endpoints (RFC 6749 §2.3, OpenID Connect Core §9):
/// exactly one method, the one the client registered.
struct ClientAuthentication: Sendable {
    let clients: ClientStore

    /// The client the request authenticates as.
    /// - Throws: 401 `invalid_client` (with `WWW-Authenticate: Basic` when Basic was tried), 400 `invalid_request`.
    func authenticate(_ request: HTTPRequest, form: [String: String]) throws -> ClientStore.Client {
        var basic: (id: String, secret: String)?
        if let header = request.headers["Authorization"] {
            guard header.lowercased().hasPrefix("basic "),
                let decoded = Data(base64Encoded: String(header.dropFirst(6)).trimmingCharacters(in: .whitespaces)),
                let text = String(data: decoded, encoding: .utf8), let colon = text.firstIndex(of: ":")
            else { throw Self.failed(basic: true) }
            // RFC 6749 §2.3.1: both halves are form-encoded before Base64.
            basic = (
                FormEncoding.decode("a=" + text[..<colon]).first?.1 ?? "",
                FormEncoding.decode("a=" + text[text.index(after: colon)...]).first?.1 ?? ""
            )
        }
        if basic != nil && form["client_secret"] != nil {
            throw OAuthError.invalidRequest("use one client authentication method")
        }
        guard let clientID = basic?.id ?? form["client_id"], !clientID.isEmpty else {
            throw Self.failed(basic: false)
        }
        if let basic, let bodyID = form["client_id"], bodyID != basic.id {
            throw OAuthError.invalidRequest("client_id differs from the authenticated client")
        }
        guard let client = try clients.find(clientID) else { throw Self.failed(basic: basic != nil) }
        switch client.metadata.tokenEndpointAuthMethod {
        case "client_secret_basic":
            guard let basic, client.accepts(secret: basic.secret) else { throw Self.failed(basic: true) }
        case "client_secret_post":
            guard basic == nil, let secret = form["client_secret"], client.accepts(secret: secret) else {
                throw Self.failed(basic: basic != nil)
            }
        default:
            // A public client proves nothing here; PKCE binds its codes.
            guard basic == nil, form["client_secret"] == nil else { throw Self.failed(basic: basic != nil) }
        }
        return client
    }

    static func failed(basic: Bool) -> ClientAuthenticationFailure { ClientAuthenticationFailure(basic: basic) }
}

/// `invalid_client`; the answer carries `WWW-Authenticate: Basic` when the client tried Basic (RFC 6749 §5.2).
struct ClientAuthenticationFailure: Error {
    let basic: Bool

    var response: HTTPResponse {
        var response = OAuthError.invalidClient("client authentication failed").response
        if basic { response.headers.set("WWW-Authenticate", "Basic realm=\"token\"") }
        return response
    }
}
