import BrokerCrypto
import Foundation
import HTTPServer
import JOSE
import Locking
import Observability
import StrictJSON
import Synchronization

/// A tiny OpenID Connect provider on loopback for the console's sign-in tests: discovery,
/// `/authorize` (answers at once with a code, as if the operator had signed in), `/token`
/// (checks client authentication and PKCE, returns an ES256 ID token) and `/jwks`. What the
/// next ID token says is set by the test, wrong claims included.
final class FakeIdentityProvider: Sendable {
    struct Claims: Sendable {
        var sub = "op-1"
        var name = "Olive Operator"
        var groups: [String] = ["dpo"]
        /// Seconds before now of `auth_time`; nil leaves it out.
        var authTimeAgo: Double? = 0
        var issuer: String?
        var audience: JSONValue?
        var nonce: String?
        var expiresIn: Double = 300
    }

    struct Authorization: Sendable {
        var nonce: String
        var challenge: String
        var redirectURI: String
        var query: [String: String]
    }

    let clientID = "console-client"
    let clientSecret = "console-secret"
    let next = Lock(Claims())
    /// Every `/authorize` request's query, oldest first.
    let authorizations = Lock<[[String: String]]>([])
    private let codes = Lock<[String: Authorization]>([:])
    private let signer: JWSSigner
    private let publicKey: JWK
    private let server = Lock<HTTPServer?>(nil)

    var issuer: String { "http://127.0.0.1:\(server.withLock { $0!.port })" }

    init() throws {
        let key = try AsymmetricKey.generateP256()
        signer = try JWSSigner(key: key, keyID: "idp-1")
        publicKey = JWK(key: key, keyID: "idp-1")
        var router = Router()
        router.get("/.well-known/openid-configuration") { [unowned self] _ in
            .json(
                JSONValue.object([
                    "issuer": .string(issuer), "authorization_endpoint": .string(issuer + "/authorize"),
                    "token_endpoint": .string(issuer + "/token"), "jwks_uri": .string(issuer + "/jwks"),
                ]))
        }
        router.get("/jwks") { [unowned self] _ in .json(JSONValue.object(["keys": .array([.object(try publicKey.publicJSON())])]))
        }
        router.get("/authorize") { [unowned self] request in
            authorizations.withLock { $0.append(request.query) }
            let code = Base64URL.encode(SecureRandom.bytes(16))
            codes.withLock {
                $0[code] = Authorization(
                    nonce: request.query["nonce"] ?? "", challenge: request.query["code_challenge"] ?? "",
                    redirectURI: request.query["redirect_uri"] ?? "", query: request.query)
            }
            let location =
                (request.query["redirect_uri"] ?? "") + "?code=\(code)&state="
                + FormEncodingForTests.escape(request.query["state"] ?? "")
            return HTTPResponse(status: 302, headers: ["Location": location])
        }
        router.post("/token") { [unowned self] request in
            let fields = FormEncodingForTests.decode(request.body)
            let basic = Data("\(clientID):\(clientSecret)".utf8).base64EncodedString()
            guard request.headers["Authorization"] == "Basic \(basic)" else {
                return .json(JSONValue.object(["error": "invalid_client"]), status: 401)
            }
            guard let code = fields["code"], let authorization = codes.withLock({ $0.removeValue(forKey: code) }),
                fields["redirect_uri"] == authorization.redirectURI,
                Base64URL.encode(SHA256.hash(fields["code_verifier"] ?? "")) == authorization.challenge
            else { return .json(JSONValue.object(["error": "invalid_grant"]), status: 400) }
            let claims = next.withLock { $0 }
            let now = Date().timeIntervalSince1970
            var payload: [String: JSONValue] = [
                "iss": .string(claims.issuer ?? issuer), "aud": claims.audience ?? .string(clientID), "sub": .string(claims.sub),
                "iat": .integer(Int64(now)), "exp": .integer(Int64(now + claims.expiresIn)),
                "nonce": .string(claims.nonce ?? authorization.nonce), "preferred_username": .string(claims.name),
                "groups": .array(claims.groups.map(JSONValue.string)),
            ]
            if let ago = claims.authTimeAgo { payload["auth_time"] = .integer(Int64(now - ago)) }
            return .json(JSONValue.object(["id_token": .string(try signer.sign(claims: payload)), "token_type": "Bearer"]))
        }
        var configuration = HTTPServer.Configuration()
        configuration.listen = "127.0.0.1:0"
        configuration.workerThreads = 2
        configuration.accessLog = false
        let server = HTTPServer(
            configuration: configuration, router: router, logger: Logger(label: "idp", sink: .capturing(level: .error)),
            metrics: MetricsRegistry())
        try server.start()
        self.server.withLock { $0 = server }
    }

    deinit { server.withLock { $0?.shutdown() } }
}

/// Form encoding and decoding for the fake provider.
enum FormEncodingForTests {
    static func escape(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._~"))) ?? ""
    }

    static func decode(_ body: [UInt8]) -> [String: String] {
        var fields: [String: String] = [:]
        for pair in String(decoding: body, as: UTF8.self).split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map {
                String($0).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? ""
            }
            fields[parts[0]] = parts.count > 1 ? parts[1] : ""
        }
        return fields
    }
}
