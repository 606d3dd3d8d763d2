import BrokerCrypto
import Foundation
import HTTPClient
import JOSE
import Locking
import StrictJSON
import Synchronization

/// Who an ID token says signed in, once every check passed.
struct OIDCIdentity: Sendable {
    var subject: String
    var displayName: String
    var roles: Set<ConsoleRole>
    /// The operator's groups that the role map names (at most as many as it has entries): the
    /// session keeps them and works its roles out from them on every request.
    var groups: [String]
    var authTime: Date
}

/// Why an OpenID Connect sign-in was refused: a stable code for the audit log, words for the
/// log; the page says only that it was.
struct OIDCFailure: Error, CustomStringConvertible {
    var code: String
    var description: String
    /// The operator, when the provider vouched for one (a valid ID token that maps to no role).
    var subject: String?
    init(_ code: String, _ description: String, subject: String? = nil) {
        self.code = code
        self.description = description
        self.subject = subject
    }
}

/// The console's relying party: discovery, the authorization URL (code flow, PKCE S256,
/// state, nonce; `max_age` and `prompt=login` for a step-up), the code exchange and the ID
/// token's checks: the broker's JOSE verifier (RS256/ES256 only) against the issuer's JWKS,
/// `iss` exact, `aud` (and `azp`) the console's client id, `exp`/`iat`, `nonce`, and
/// `auth_time` when a recent sign-in is required. Blocking calls (curl) run on the
/// console's own request threads.
final class OIDCClient: Sendable {
    let settings: ConsoleConfiguration.OIDC
    let redirectURI: String
    let transport: any HTTPTransport
    private let verifier = JWSVerifier()
    /// Clock skew allowed on `exp`, `iat` and `auth_time`.
    static let leeway: TimeInterval = 60

    private struct Provider: Sendable {
        var authorizationEndpoint: String
        var tokenEndpoint: String
        var jwksURI: String
        var keys: JWKSet
        var fetchedAt: Date
    }
    private let provider = Lock<Provider?>(nil)

    init(settings: ConsoleConfiguration.OIDC, redirectURI: String, transport: any HTTPTransport) {
        self.settings = settings
        self.redirectURI = redirectURI
        self.transport = transport
    }

    /// The URL that starts a sign-in at the provider.
    func authorizationURL(state: String, nonce: String, verifier: String, stepUp: Bool) throws -> String {
        let provider = try current()
        var fields: [(String, String)] = [
            ("response_type", "code"), ("client_id", settings.clientID), ("redirect_uri", redirectURI),
            ("scope", "openid profile"), ("state", state), ("nonce", nonce),
            ("code_challenge", Base64URL.encode(SHA256.hash(verifier))), ("code_challenge_method", "S256"),
        ]
        // prompt=login alone proves nothing; auth_time, checked at the callback, does.
        if stepUp { fields += [("max_age", "300"), ("prompt", "login")] }
        let separator = provider.authorizationEndpoint.contains("?") ? "&" : "?"
        return provider.authorizationEndpoint + separator + FormEncoding.encode(fields)
    }

    /// Exchanges the code and checks the ID token it brings.
    /// - Parameter maximumAge: how old `auth_time` may be (a step-up); nil: any.
    func identity(code: String, verifier codeVerifier: String, nonce: String, maximumAge: TimeInterval?) throws
        -> OIDCIdentity
    {
        let provider = try current()
        // client_secret_basic (RFC 6749 §2.3.1: each part form-encoded first).
        let basic = Data("\(FormEncoding.escape(settings.clientID)):\(FormEncoding.escape(settings.clientSecret))".utf8)
            .base64EncodedString()
        let response = try transport.send(
            .form(
                url: provider.tokenEndpoint,
                fields: [
                    ("grant_type", "authorization_code"), ("code", code), ("redirect_uri", redirectURI),
                    ("code_verifier", codeVerifier),
                ], headers: [("Authorization", "Basic \(basic)"), ("Accept", "application/json")]))
        guard response.status == 200, response.body.count <= 64 * 1024 else {
            throw OIDCFailure("token_endpoint", "token endpoint answered \(response.status)")
        }
        guard let token = try? JSONValue.parseObject(response.body)["id_token"]?.stringValue else {
            throw OIDCFailure("token_endpoint", "token response without id_token")
        }
        let verified: VerifiedJWS
        do {
            verified = try verifier.verify(token, keys: provider.keys)
        } catch {
            // A key rotated since the last fetch: fetch the set again, once, and retry.
            verified = try verifier.verify(token, keys: try current(refresh: true).keys)
        }
        let claims = try verified.claims()
        return try check(claims, nonce: nonce, maximumAge: maximumAge)
    }

    func check(_ claims: [String: JSONValue], nonce: String, maximumAge: TimeInterval?) throws -> OIDCIdentity {
        let now = Date().timeIntervalSince1970
        guard claims["iss"]?.stringValue == settings.issuer else { throw OIDCFailure("iss", "iss is not the configured issuer") }
        let audiences: [String]
        if let single = claims["aud"]?.stringValue {
            audiences = [single]
        } else {
            audiences = (claims["aud"]?.arrayValue ?? []).compactMap(\.stringValue)
        }
        guard audiences.contains(settings.clientID) else { throw OIDCFailure("aud", "aud does not name the console") }
        if audiences.count > 1, claims["azp"]?.stringValue != settings.clientID {
            throw OIDCFailure("azp", "azp is not the console")
        }
        guard let expiry = claims["exp"]?.doubleValue, expiry + Self.leeway > now else { throw OIDCFailure("expired", "expired") }
        guard let issued = claims["iat"]?.doubleValue, issued - Self.leeway < now else {
            throw OIDCFailure("iat", "iat missing or ahead")
        }
        guard let sent = claims["nonce"]?.stringValue,
            ConstantTime.equals(Array(sent.utf8), Array(nonce.utf8))
        else { throw OIDCFailure("nonce", "nonce does not match") }
        guard let subject = claims["sub"]?.stringValue, !subject.isEmpty, subject.utf8.count <= 255 else {
            throw OIDCFailure("sub", "sub missing")
        }
        let authTime = claims["auth_time"]?.doubleValue
        if let maximumAge {
            guard let authTime, now - authTime <= maximumAge + Self.leeway, authTime - Self.leeway < now else {
                throw OIDCFailure("auth_time", "auth_time missing or older than \(Int(maximumAge)) s")
            }
        }
        let groups: [String]
        if let one = claims[settings.groupsClaim]?.stringValue {
            groups = [one]
        } else {
            groups = (claims[settings.groupsClaim]?.arrayValue ?? []).compactMap(\.stringValue)
        }
        let mapped = Array(Set(groups.filter { settings.roleMap[$0] != nil })).sorted()
        let roles = settings.roles(of: mapped)
        guard !roles.isEmpty else {
            throw OIDCFailure("no_mapped_group", "no group of the operator maps to a console role", subject: subject)
        }
        let name =
            claims["preferred_username"]?.stringValue ?? claims["name"]?.stringValue ?? subject
        return OIDCIdentity(
            subject: subject, displayName: String(name.prefix(100)), roles: roles, groups: mapped,
            // Without auth_time the provider does not say when the operator proved who they are
            // (an SSO session can be hours old): no step-up window follows such a sign-in.
            authTime: Date(timeIntervalSince1970: authTime ?? 0))
    }

    /// Discovery and keys, fetched at first use and again after ten minutes (or on demand).
    private func current(refresh: Bool = false) throws -> Provider {
        if !refresh, let cached = provider.withLock({ $0 }), cached.fetchedAt.timeIntervalSinceNow > -600 { return cached }
        let discovery = try fetchJSON(settings.issuer + "/.well-known/openid-configuration")
        guard discovery["issuer"]?.stringValue == settings.issuer,
            let authorization = discovery["authorization_endpoint"]?.stringValue,
            let tokenEndpoint = discovery["token_endpoint"]?.stringValue,
            let jwksURI = discovery["jwks_uri"]?.stringValue
        else { throw OIDCFailure("provider_unavailable", "discovery document incomplete or for another issuer") }
        let keys = try fetch(jwksURI)
        let fetched = Provider(
            authorizationEndpoint: authorization, tokenEndpoint: tokenEndpoint, jwksURI: jwksURI,
            keys: try JWKSet(json: keys), fetchedAt: Date())
        provider.withLock { $0 = fetched }
        return fetched
    }

    private func fetch(_ url: String) throws -> [UInt8] {
        let response = try transport.send(.init(url: url, headers: [("Accept", "application/json")]))
        guard response.status == 200, response.body.count <= 256 * 1024 else {
            throw OIDCFailure("provider_unavailable", "\(url) answered \(response.status)")
        }
        return response.body
    }

    private func fetchJSON(_ url: String) throws -> [String: JSONValue] {
        guard let object = try? JSONValue.parseObject(try fetch(url)) else {
            throw OIDCFailure("provider_unavailable", "\(url) is not JSON")
        }
        return object
    }
}
