import BrokerCrypto
import Foundation
import HTTPClient
import JOSE
import StrictJSON

/// How a token or revocation request says who is calling, as the HTTP layer read it:
/// typed values, no HTTP request.
struct ClientCredentials: Sendable {
    /// `Authorization: Basic` (RFC 6749 §2.3.1), decoded; nil when absent.
    var basic: (id: String, secret: String)?
    /// An Authorization header that is not a readable Basic one.
    var malformedAuthorization = false
    /// The form fields (client_id, client_secret, client_assertion_type, client_assertion).
    var form: [String: String]

    init(authorization header: String?, form: [String: String]) {
        self.form = form
        guard let header else { return }
        guard header.lowercased().hasPrefix("basic "),
            let decoded = Data(base64Encoded: String(header.dropFirst(6)).trimmingCharacters(in: .whitespaces)),
            let text = String(data: decoded, encoding: .utf8), let colon = text.firstIndex(of: ":")
        else {
            malformedAuthorization = true
            return
        }
        // RFC 6749 §2.3.1: both halves are form-encoded before Base64.
        basic = (
            FormEncoding.decode("a=" + text[..<colon]).first?.1 ?? "",
            FormEncoding.decode("a=" + text[text.index(after: colon)...]).first?.1 ?? ""
        )
    }
}

/// Who calls the token, revocation and introspection endpoints (RFC 6749 §2.3, OpenID Connect
/// Core §9, RFC 7523):
/// - a confidential client with a secret: `client_secret_basic` or `client_secret_post`,
///   whichever it registered (discovery advertises both, and Nextcloud's user_oidc sends the
///   secret in the body whenever that is advertised; issue 36);
/// - a `private_key_jwt` client: a signed assertion (RS256/ES256) with its registered keys,
///   `iss` = `sub` = its client id, `aud` the token endpoint, the issuer or the endpoint
///   called, an `exp` at most an hour ahead, and a `jti` good once;
/// - a public client (`none`): nothing (PKCE binds its codes).
struct ClientAuthentication: Sendable {
    let clients: ClientStore
    let keys: ClientKeys
    let assertions: ClientAssertionStore
    /// The issuer and the token endpoint's URL: an assertion's `aud` names one of them.
    let audiences: Set<String>

    static let assertionType = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    /// How far ahead an assertion's `exp` may be (bounds the jti table), and the clock leeway.
    static let maximumAssertionLifetime: TimeInterval = 3600
    static let leeway: TimeInterval = 60

    /// The client the request authenticates as; `endpoint` is the URL called (an assertion
    /// may name it as its `aud`).
    /// - Throws: 401 `invalid_client` (with `WWW-Authenticate: Basic` when Basic was tried), 400 `invalid_request`.
    func authenticate(_ credentials: ClientCredentials, endpoint: String) throws -> ClientStore.Client {
        let form = credentials.form
        if credentials.malformedAuthorization { throw Self.failed(basic: true) }
        let basic = credentials.basic
        if form["client_assertion"] != nil || form["client_assertion_type"] != nil {
            guard basic == nil, form["client_secret"] == nil else {
                throw OAuthError.invalidRequest("use one client authentication method")
            }
            return try assertion(form, endpoint: endpoint)
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
        if client.metadata.isPublic {
            // A public client proves nothing here; PKCE binds its codes.
            guard basic == nil, form["client_secret"] == nil else { throw Self.failed(basic: basic != nil) }
            return client
        }
        // Either secret method for any client with a secret (RFC 6749 §2.3.1 allows both);
        // a private_key_jwt client has no secret and accepts none.
        guard let secret = basic?.secret ?? form["client_secret"], client.accepts(secret: secret) else {
            throw Self.failed(basic: basic != nil)
        }
        return client
    }

    /// RFC 7523 §2.2 and §3, OpenID Connect Core §9 (private_key_jwt).
    private func assertion(_ form: [String: String], endpoint: String) throws -> ClientStore.Client {
        guard form["client_assertion_type"] == Self.assertionType, let token = form["client_assertion"] else {
            throw OAuthError.invalidRequest("client_assertion_type must be \(Self.assertionType), with client_assertion")
        }
        // The client is named by the (not yet verified) subject; the signature decides.
        guard token.utf8.count <= 8192, let unverified = Self.unverifiedClaims(token),
            let subject = unverified["sub"]?.stringValue
        else { throw Self.failed(basic: false) }
        if let bodyID = form["client_id"], bodyID != subject {
            throw OAuthError.invalidRequest("client_id differs from the assertion's sub")
        }
        guard let client = try clients.find(subject), client.metadata.usesPrivateKeyJWT else { throw Self.failed(basic: false) }
        let algorithms: Set<JWSAlgorithm> =
            client.metadata.signingAlgorithm.flatMap { JWSAlgorithm(rawValue: $0) }.map { [$0] } ?? [.rs256, .es256]
        let verifier = JWSVerifier(maximumBytes: 8192, allowedAlgorithms: algorithms)
        let claims: [String: JSONValue]
        do {
            claims = try verify(token, client: client, verifier: verifier, refresh: false)
        } catch let error as JOSEError where error.code == .keyNotFound {
            // A key rotated in at the client since the last fetch of its jwks_uri.
            guard client.metadata.jwksURI != nil else { throw Self.failed(basic: false) }
            claims = try verify(token, client: client, verifier: verifier, refresh: true)
        }
        let now = Date().timeIntervalSince1970
        let audience: Set<String> = {
            if let one = claims["aud"]?.stringValue { return [one] }
            return Set((claims["aud"]?.arrayValue ?? []).compactMap(\.stringValue))
        }()
        guard claims["iss"]?.stringValue == client.clientID, claims["sub"]?.stringValue == client.clientID,
            !audience.isDisjoint(with: audiences.union([endpoint])),
            let exp = claims["exp"]?.integerValue, Double(exp) > now - Self.leeway,
            Double(exp) <= now + Self.maximumAssertionLifetime + Self.leeway,
            claims["nbf"]?.integerValue.map({ Double($0) <= now + Self.leeway }) ?? true,
            claims["iat"]?.integerValue.map({ Double($0) <= now + Self.leeway }) ?? true,
            let jti = claims["jti"]?.stringValue, !jti.isEmpty, jti.utf8.count <= 256
        else { throw Self.failed(basic: false) }
        guard try assertions.spend(clientID: client.clientID, jti: jti, expiresAt: Date(timeIntervalSince1970: Double(exp)))
        else { throw Self.failed(basic: false) }
        return client
    }

    private func verify(
        _ token: String, client: ClientStore.Client, verifier: JWSVerifier, refresh: Bool
    ) throws -> [String: JSONValue] {
        let set: JWKSet
        do {
            set = try keys.keys(of: client, refresh: refresh)
        } catch {
            throw Self.failed(basic: false)
        }
        do {
            return try verifier.verify(token) { header in
                // A set of one key may be used without a kid; otherwise the kid names the key.
                if let kid = header.keyID {
                    guard let key = set.verificationKey(keyID: kid) else { throw JOSEError(.keyNotFound, "unknown kid") }
                    return key
                }
                let usable = set.keys.filter(\.canVerify)
                guard usable.count == 1 else { throw JOSEError(.keyNotFound, "no kid, and more than one key") }
                return usable[0]
            }.claims()
        } catch let error as JOSEError where error.code == .keyNotFound && !refresh {
            throw error
        } catch {
            throw Self.failed(basic: false)
        }
    }

    /// The payload of a compact JWS, not verified: only to learn which client it claims to be.
    static func unverifiedClaims(_ token: String) -> [String: JSONValue]? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let payload = Base64URL.decode(parts[1]),
            case .object(let claims)? = try? JSONValue.parse(payload)
        else { return nil }
        return claims
    }

    static func failed(basic: Bool) -> ClientAuthenticationFailure { ClientAuthenticationFailure(basic: basic) }
}

/// `invalid_client`; the answer (HTTP/OAuthResponses.swift) carries `WWW-Authenticate: Basic`
/// when the client tried Basic (RFC 6749 §5.2).
struct ClientAuthenticationFailure: Error {
    let basic: Bool
}
