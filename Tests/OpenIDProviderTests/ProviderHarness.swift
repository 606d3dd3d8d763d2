import AppleSimulator
import BrokerAPI
import BrokerCore
import BrokerCrypto
import Foundation
import HTTPClient
import JOSE
import Observability
import PostgresClient
import StrictJSON
import TestSupport
import Testing

/// A broker with the OpenID Provider on (issuer with a path), its own database and Apple
/// simulator; the relying party and the browser are played with HTTP requests.
final class ProviderHarness: Sendable {
    static let issuer = "https://id.example.com/oidc"
    static let publicURL = "https://broker.example.com"
    static let appleClientID = "com.example.web"
    static let teamID = "TEAMID1234"

    let application: BrokerApplication
    let simulator: AppleSimulator
    let environment: [String: String]
    let client = CurlTransport()

    var baseURL: String { "http://127.0.0.1:\(application.port)" }
    var pool: PostgresPool { application.database.pool }

    init(extra: [String: String] = [:], roles: String = "api") throws {
        simulator = try AppleSimulator(logger: Logger(label: "sim", sink: .capturing(level: .warning)))
        try simulator.start()
        let keyPath = try TestKeys.privateKeyFile()
        var environment = [
            "DATABASE_URL": try TestPostgres.freshDatabase().connectionString, "BROKER_LISTEN": "127.0.0.1:0",
            "BROKER_LOG_LEVEL": "warning", "BROKER_HTTP_THREADS": "4", "BROKER_ROLES": roles,
            "APPLE_TEAM_ID": Self.teamID, "APPLE_KEY_ID": "KEYID12345", "APPLE_PRIVATE_KEY_PATH": keyPath,
            "APPLE_CLIENT_IDS": "com.example.app,\(Self.appleClientID)", "APPLE_BASE_URL": simulator.baseURL,
            "APPLE_APP_GROUPS": "com.example.app=\(Self.appleClientID)",
            "TOKEN_ENCRYPTION_KEY": Data(SecureRandom.bytes(32)).base64EncodedString(),
            "BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true", "BROKER_PUBLIC_URL": Self.publicURL,
            "OIDC_ISSUER": Self.issuer, "OIDC_APPLE_CLIENT_ID": Self.appleClientID,
        ]
        environment.merge(extra) { $1 }
        self.environment = environment
        let pem = try String(contentsOfFile: keyPath, encoding: .utf8)
        simulator.registerTeam(
            teamID: Self.teamID, keyID: "KEYID12345", publicKey: try AppleSimulator.publicKey(fromPEM: pem),
            clientIDs: ["com.example.app", Self.appleClientID])
        simulator.registerReturnURLs(clientID: Self.appleClientID, urls: [Self.publicURL + "/v1/apple/web/callback"])
        let configuration = try BrokerConfiguration.load(environment: environment, requireApple: true)
        application = try BrokerApplication(
            configuration: configuration, logger: Logger(label: "broker", sink: .capturing(level: .warning)))
        try application.start()
    }

    deinit {
        application.stop()
        simulator.stop()
    }

    // MARK: HTTP

    func send(
        _ method: String, _ path: String, headers: [(String, String)] = [], body: String? = nil
    ) throws -> HTTPClientResponse {
        try client.send(
            .init(
                method: method, url: path.hasPrefix("http") ? path : baseURL + path, headers: headers,
                body: Array((body ?? "").utf8)))
    }

    func adminKey() throws -> String { try APIKeyStore(pool: pool).create(name: "admin", scopes: [.admin]).secret }

    /// Registers a relying party over RFC 7591; its answer.
    func register(_ metadata: [String: Any], key: String? = nil) throws -> HTTPClientResponse {
        let body = String(decoding: try JSONSerialization.data(withJSONObject: metadata), as: UTF8.self)
        return try send(
            "POST", "/oidc/register",
            headers: [("Content-Type", "application/json"), ("Authorization", "Bearer \(try key ?? adminKey())")], body: body)
    }

    struct RegisteredClient {
        let id: String
        let secret: String?
        let redirectURI: String
    }

    func confidentialClient(
        method: String = "client_secret_basic", redirectURI: String = "https://rp.example.com/cb", extra: [String: Any] = [:]
    ) throws -> RegisteredClient {
        var metadata: [String: Any] = [
            "redirect_uris": [redirectURI], "token_endpoint_auth_method": method,
            "grant_types": ["authorization_code", "refresh_token"], "client_name": "Test RP",
        ]
        metadata.merge(extra) { $1 }
        let response = try register(metadata)
        #expect(response.status == 201, "\(response.bodyText)")
        return RegisteredClient(
            id: try #require(response.json["client_id"] as? String), secret: response.json["client_secret"] as? String,
            redirectURI: redirectURI)
    }

    func publicClient(redirectURI: String = "com.example.app:/oauth2redirect") throws -> RegisteredClient {
        try confidentialClient(method: "none", redirectURI: redirectURI)
    }

    /// A redirect's target and query.
    struct Redirect {
        var base: String
        var query: [String: String]

        init(_ response: HTTPClientResponse) throws {
            let location = try #require(response.header("location"), "no Location in \(response.status) \(response.bodyText)")
            let parts = location.split(separator: "?", maxSplits: 1).map(String.init)
            base = parts[0]
            query = [:]
            for (name, value) in FormEncoding.decode(parts.count > 1 ? parts[1] : "") { query[name] = value }
        }
    }

    /// GET the authorize endpoint with these parameters.
    func authorize(_ parameters: [(String, String)]) throws -> HTTPClientResponse {
        try send("GET", "/oidc/authorize?" + FormEncoding.encode(parameters), headers: [("Accept", "text/html")])
    }

    /// The browser's trip: authorize → Apple (the simulator plays the user with `sim`) → Apple's
    /// form post to the broker's callback → the redirect back to the RP.
    func signIn(_ parameters: [(String, String)], sim: [(String, String)] = []) throws -> Redirect {
        let start = try authorize(parameters)
        #expect(start.status == 302, "\(start.bodyText)")
        let toApple = try Redirect(start)
        #expect(toApple.base == simulator.baseURL + "/auth/authorize", "\(toApple.base)")
        let page = try send("GET", toApple.base + "?" + FormEncoding.encode(toApple.query.map { ($0.key, $0.value) } + sim))
        #expect(page.status == 200, "\(page.bodyText)")
        let html = page.bodyText
        func unescape(_ text: String) -> String {
            text.replacingOccurrences(of: "&quot;", with: "\"").replacingOccurrences(of: "&#39;", with: "'")
                .replacingOccurrences(of: "&lt;", with: "<").replacingOccurrences(of: "&gt;", with: ">")
                .replacingOccurrences(of: "&amp;", with: "&")
        }
        let action = unescape(String(try #require(html.firstMatch(of: /action="([^"]*)"/), "no form: \(html)").1))
        #expect(action == Self.publicURL + "/v1/apple/web/callback")
        let fields = html.matches(of: /name="([^"]*)" value="([^"]*)"/).map { (unescape(String($0.1)), unescape(String($0.2))) }
        // The browser's cookies from the start (the authorization's binding) go back with Apple's post.
        let cookies = start.headers.filter { $0.0 == "set-cookie" }.map { String($0.1.split(separator: ";")[0]) }
        let posted = try send(
            "POST", "/v1/apple/web/callback",
            headers: [("Content-Type", "application/x-www-form-urlencoded")]
                + (cookies.isEmpty ? [] : [("Cookie", cookies.joined(separator: "; "))]),
            body: FormEncoding.encode(fields))
        #expect(posted.status == 303, "\(posted.bodyText)")
        return try Redirect(posted)
    }

    /// POST to the token endpoint, authenticated as `client` per its method.
    func token(_ fields: [(String, String)], as client: RegisteredClient?, basic: Bool = true) throws -> HTTPClientResponse {
        var fields = fields
        var headers = [("Content-Type", "application/x-www-form-urlencoded")]
        if let client {
            if let secret = client.secret, basic {
                let pair = FormEncoding.escape(client.id) + ":" + FormEncoding.escape(secret)
                headers.append(("Authorization", "Basic " + Data(pair.utf8).base64EncodedString()))
            } else {
                fields.append(("client_id", client.id))
                if let secret = client.secret { fields.append(("client_secret", secret)) }
            }
        }
        return try send("POST", "/oidc/token", headers: headers, body: FormEncoding.encode(fields))
    }

    /// The ID token's claims, verified against the provider's JWKS.
    func verifiedClaims(_ idToken: String) throws -> [String: JSONValue] {
        let jwks = try send("GET", "/oidc/jwks")
        return try JWSVerifier(allowedAlgorithms: [.rs256]).verify(idToken, keys: try JWKSet(json: jwks.body)).claims()
    }

    func count(_ query: PostgresQuery) throws -> Int { try pool.query(query).single().decode(Int.self, 0) }
}

/// A PKCE pair (RFC 7636): the verifier and its S256 challenge.
struct PKCE {
    let verifier = Base64URL.encode(SecureRandom.bytes(32))
    var challenge: String { Base64URL.encode(SHA256.hash(verifier)) }
}

extension HTTPClientResponse {
    var json: [String: Any] { (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] ?? [:] }
}
