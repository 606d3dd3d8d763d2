import BrokerCrypto
import Foundation
import HTTPClient
import HTTPServer
import JOSE
import Locking
import PostgresClient
import StrictJSON
import Synchronization
import TestSupport
import Testing

@testable import OpenIDProvider

/// Who may call the token, revocation and introspection endpoints (issue 36): both secret
/// methods, private_key_jwt (RFC 7523) with registered keys or a jwks_uri, and resource
/// servers introspecting (RFC 7662) only their own audience's tokens.
@Suite("OpenID Provider client authentication", .offPool)
struct ClientAuthenticationTests {
    func codeRequest(_ client: ProviderHarness.RegisteredClient, scope: String = "openid email profile offline_access")
        -> [(String, String)]
    {
        [
            ("response_type", "code"), ("client_id", client.id), ("redirect_uri", client.redirectURI), ("scope", scope),
            ("state", "s"), ("nonce", "n"),
        ]
    }

    func code(_ harness: ProviderHarness, _ client: ProviderHarness.RegisteredClient) throws -> [(String, String)] {
        let code = try #require(try harness.signIn(codeRequest(client)).query["code"])
        return [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)]
    }

    @Test("client_secret_basic and client_secret_post both work for every confidential client, whatever it registered")
    func bothSecretMethods() throws {
        let harness = try ProviderHarness()
        let basic = try harness.confidentialClient(method: "client_secret_basic")
        let viaBody = try harness.token(try code(harness, basic), as: basic, basic: false)
        #expect(viaBody.status == 200, "Nextcloud user_oidc sends the secret in the body: \(viaBody.bodyText)")
        let post = try harness.confidentialClient(method: "client_secret_post")
        let viaHeader = try harness.token(try code(harness, post), as: post, basic: true)
        #expect(viaHeader.status == 200, "\(viaHeader.bodyText)")
        // Both at once is still one method too many (RFC 6749 §2.3).
        var fields = try code(harness, post)
        fields.append(("client_secret", post.secret!))
        let both = try harness.token(fields, as: post, basic: true)
        #expect(both.json["error"] as? String == "invalid_request", "\(both.bodyText)")
    }

    // MARK: private_key_jwt

    /// A client's key pair and its assertions (RFC 7523 §3).
    struct AssertionSigner {
        let key: AsymmetricKey
        let kid: String?

        var jwks: [String: Any] {
            let members = (try? JWK(key: key, keyID: kid).publicJSON()) ?? [:]
            let object = (try? JSONSerialization.jsonObject(with: Data(JSONValue.object(members).serialized()))) ?? [:]
            return ["keys": [object]]
        }

        func assertion(
            clientID: String, audience: String = ProviderHarness.issuer + "/token", lifetime: Int = 120,
            jti: String = UUID().uuidString, issuer: String? = nil
        ) throws -> String {
            let now = Int64(Date().timeIntervalSince1970)
            return try JWSSigner(key: key, keyID: kid).sign(claims: [
                "iss": .string(issuer ?? clientID), "sub": .string(clientID), "aud": .string(audience),
                "iat": .integer(now), "exp": .integer(now + Int64(lifetime)), "jti": .string(jti),
            ])
        }
    }

    func assertionFields(_ assertion: String) -> [(String, String)] {
        [("client_assertion_type", ClientAuthentication.assertionType), ("client_assertion", assertion)]
    }

    @Test("private_key_jwt with registered jwks: a signed assertion authenticates; replays, wrong aud, long exp, secrets refused")
    func privateKeyJWTInline() throws {
        let harness = try ProviderHarness()
        let signer = AssertionSigner(key: try AsymmetricKey.generateRSA(), kid: nil)
        let registered = try harness.register([
            "redirect_uris": ["https://rp.example.com/cb"], "token_endpoint_auth_method": "private_key_jwt",
            "jwks": signer.jwks, "grant_types": ["authorization_code", "refresh_token"],
        ])
        #expect(registered.status == 201, "\(registered.bodyText)")
        #expect(registered.json["client_secret"] == nil, "no secret for a private_key_jwt client")
        #expect(registered.json["token_endpoint_auth_method"] as? String == "private_key_jwt")
        let client = ProviderHarness.RegisteredClient(
            id: try #require(registered.json["client_id"] as? String), secret: nil, redirectURI: "https://rp.example.com/cb")
        // The previous release reads the row as client_secret_basic with a secret nobody has (sql/0024).
        #expect(
            try harness.count(
                "SELECT count(*) FROM oidc_clients WHERE client_id = \(client.id) AND token_endpoint_auth_method = 'client_secret_basic' AND secret_hash IS NOT NULL"
            ) == 1)

        let jti = "assertion-1"
        var fields = try code(harness, client)
        let accepted = try harness.token(
            fields + assertionFields(try signer.assertion(clientID: client.id, jti: jti)), as: nil)
        #expect(accepted.status == 200, "\(accepted.bodyText)")
        let refresh = try #require(accepted.json["refresh_token"] as? String)
        // The same jti again: refused (RFC 7523 §3 item 7), even on another request.
        let replayed = try harness.token(
            [("grant_type", "refresh_token"), ("refresh_token", refresh)]
                + assertionFields(try signer.assertion(clientID: client.id, jti: jti)), as: nil)
        #expect(replayed.status == 401 && replayed.json["error"] as? String == "invalid_client", "\(replayed.bodyText)")
        // The issuer is an accepted audience too; then the refresh goes through.
        let byIssuer = try harness.token(
            [("grant_type", "refresh_token"), ("refresh_token", refresh)]
                + assertionFields(try signer.assertion(clientID: client.id, audience: ProviderHarness.issuer)), as: nil)
        #expect(byIssuer.status == 200, "\(byIssuer.bodyText)")

        fields = try code(harness, client)
        func refused(_ assertion: String, _ why: String) throws {
            let answer = try harness.token(fields + assertionFields(assertion), as: nil)
            #expect(answer.json["error"] as? String == "invalid_client", "\(why): \(answer.bodyText)")
        }
        try refused(try signer.assertion(clientID: client.id, audience: "https://other.example.com/token"), "wrong aud")
        try refused(try signer.assertion(clientID: client.id, lifetime: 7200), "exp two hours ahead")
        try refused(try signer.assertion(clientID: client.id, lifetime: -120), "expired")
        try refused(try signer.assertion(clientID: client.id, issuer: "someone-else"), "iss is not the client")
        let stranger = AssertionSigner(key: try AsymmetricKey.generateRSA(), kid: nil)
        try refused(try stranger.assertion(clientID: client.id), "signed by a key the client did not register")
        let secretTry = try harness.token(
            fields + [("client_id", client.id), ("client_secret", "anything")], as: nil)
        #expect(secretTry.json["error"] as? String == "invalid_client", "a private_key_jwt client has no secret")
        // Still unspent: the right assertion redeems the code.
        #expect(try harness.token(fields + assertionFields(try signer.assertion(clientID: client.id)), as: nil).status == 200)

        // A private key in jwks is refused and never stored.
        var leaked = try JWK(key: signer.key, keyID: nil).publicJSON()
        leaked["d"] = .string("AAAA")
        let leakedJSON = try JSONSerialization.jsonObject(with: Data(JSONValue.object(leaked).serialized()))
        let privateKey = try harness.register([
            "redirect_uris": ["https://rp.example.com/cb"], "token_endpoint_auth_method": "private_key_jwt",
            "jwks": ["keys": [leakedJSON]],
        ])
        #expect(privateKey.status == 400 && privateKey.json["error"] as? String == "invalid_client_metadata")
    }

    /// A relying party's jwks_uri on loopback, counting fetches.
    final class KeyServer: Sendable {
        private final class State: Sendable {
            let body = Lock<[UInt8]>([])
            let fetches = Lock<Int>(0)
        }
        private let state = State()
        private let server: HTTPServer
        var url: String { "http://127.0.0.1:\(server.port)/jwks" }
        var fetches: Int { state.fetches.withLock { $0 } }

        func publish(_ jwks: [String: Any]) throws {
            let data = try JSONSerialization.data(withJSONObject: jwks)
            state.body.withLock { $0 = Array(data) }
        }

        init() throws {
            var router = Router()
            let state = state
            router.get("/jwks") { _ in
                state.fetches.withLock { $0 += 1 }
                return HTTPResponse(status: 200, headers: ["Content-Type": "application/json"], body: state.body.withLock { $0 })
            }
            server = try startLoopbackServer(router, label: "rp")
        }

        deinit { server.shutdown() }
    }

    @Test(
        "private_key_jwt with jwks_uri: fetched once and cached, fetched again for a rotated-in kid; address rules at registration"
    )
    func privateKeyJWTByURI() throws {
        let harness = try ProviderHarness()
        let keys = try KeyServer()
        let first = AssertionSigner(key: try AsymmetricKey.generateP256(), kid: "k1")
        try keys.publish(first.jwks)
        let registered = try harness.register([
            "redirect_uris": ["https://rp.example.com/cb"], "token_endpoint_auth_method": "private_key_jwt",
            "jwks_uri": keys.url, "token_endpoint_auth_signing_alg": "ES256",
        ])
        #expect(registered.status == 201, "\(registered.bodyText)")
        let client = ProviderHarness.RegisteredClient(
            id: try #require(registered.json["client_id"] as? String), secret: nil, redirectURI: "https://rp.example.com/cb")
        for _ in 0..<2 {
            let answer = try harness.token(
                try code(harness, client) + assertionFields(try first.assertion(clientID: client.id)), as: nil)
            #expect(answer.status == 200, "\(answer.bodyText)")
        }
        #expect(keys.fetches == 1, "cached")
        // The client rotates to k2: the unknown kid makes the provider fetch again (30 s after the last fetch).
        let second = AssertionSigner(key: try AsymmetricKey.generateP256(), kid: "k2")
        try keys.publish(second.jwks)
        let early = try harness.token(
            try code(harness, client) + assertionFields(try second.assertion(clientID: client.id)), as: nil)
        #expect(early.json["error"] as? String == "invalid_client", "within 30 s of a fetch the set is not fetched again")
        #expect(keys.fetches == 1)

        let strict = try ProviderHarness(extra: ["BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS": "false"])
        let loopback = try strict.register([
            "redirect_uris": ["https://rp.example.com/cb"], "token_endpoint_auth_method": "private_key_jwt",
            "jwks_uri": keys.url,
        ])
        #expect(loopback.status == 400 && loopback.json["error"] as? String == "invalid_client_metadata", "\(loopback.bodyText)")
    }

    // MARK: introspection

    @Test(
        "RFC 7662: a resource server introspects its audience's access tokens; others, refresh tokens and revoked ones are inactive"
    )
    func introspection() throws {
        let harness = try ProviderHarness()
        let mine = try harness.confidentialClient()
        let theirs = try harness.confidentialClient()
        let key = try harness.adminKey()
        let created = try harness.send(
            "POST", "/v1/oidc-resource-servers",
            headers: [("Authorization", "Bearer \(key)"), ("Content-Type", "application/json")],
            body: #"{"name":"\#(String(repeating: "é", count: 200))","client_ids":["\#(mine.id)"]}"#)
        #expect(created.status == 201, "a name of 200 characters (400 bytes), as the description counts: \(created.bodyText)")
        let serverID = try #require(created.json["resource_server_id"] as? String)
        let secret = try #require(created.json["secret"] as? String)
        let unknownAudience = try harness.send(
            "POST", "/v1/oidc-resource-servers",
            headers: [("Authorization", "Bearer \(key)"), ("Content-Type", "application/json")],
            body: #"{"client_ids":["oidc_nope"]}"#)
        // A reference to a relying party that is not there, as a deletion's unknown user_id is 404.
        #expect(unknownAudience.status == 404, "only registered relying parties")
        #expect(unknownAudience.json["code"] as? String == "oidc_client_not_found", "\(unknownAudience.bodyText)")

        let myTokens = try harness.token(try code(harness, mine), as: mine).json
        let theirTokens = try harness.token(try code(harness, theirs), as: theirs).json
        func introspect(_ token: String, secret: String = secret, basic: Bool = true) throws -> HTTPClientResponse {
            var headers = [("Content-Type", "application/x-www-form-urlencoded")]
            var fields = [("token", token)]
            if basic {
                headers.append(("Authorization", "Basic " + Data("\(serverID):\(secret)".utf8).base64EncodedString()))
            } else {
                fields += [("client_id", serverID), ("client_secret", secret)]
            }
            return try harness.send("POST", "/oidc/introspect", headers: headers, body: FormEncoding.encode(fields))
        }
        let access = try #require(myTokens["access_token"] as? String)
        let active = try introspect(access)
        #expect(active.status == 200)
        #expect(active.json["active"] as? Bool == true, "\(active.bodyText)")
        #expect(active.json["client_id"] as? String == mine.id)
        #expect(active.json["scope"] as? String == "openid email profile offline_access")
        #expect((active.json["sub"] as? String)?.count == 36)
        #expect(active.json["aud"] as? String == serverID)
        #expect(try introspect(access, basic: false).json["active"] as? Bool == true, "client_secret_post")
        // RFC 6749 §6: an access token from a refresh that asked for less carries only that scope.
        let narrowed = try harness.token(
            [
                ("grant_type", "refresh_token"), ("refresh_token", try #require(myTokens["refresh_token"] as? String)),
                ("scope", "openid"),
            ], as: mine)
        let narrowedActive = try introspect(try #require(narrowed.json["access_token"] as? String))
        #expect(narrowedActive.json["scope"] as? String == "openid", "\(narrowedActive.bodyText)")
        #expect(try introspect(access).json["scope"] as? String == "openid email profile offline_access")
        let other = try introspect(try #require(theirTokens["access_token"] as? String))
        #expect(other.json["active"] as? Bool == false && other.json.count == 1, "another audience: \(other.bodyText)")
        #expect(try introspect(try #require(myTokens["refresh_token"] as? String)).json["active"] as? Bool == false)
        let wrong = try introspect(access, secret: "wrong")
        #expect(wrong.status == 401 && wrong.json["error"] as? String == "invalid_client")
        // A relying party's own credentials are not a resource server's.
        let asClient = try harness.send(
            "POST", "/oidc/introspect",
            headers: [
                ("Content-Type", "application/x-www-form-urlencoded"),
                ("Authorization", "Basic " + Data("\(mine.id):\(mine.secret!)".utf8).base64EncodedString()),
            ], body: FormEncoding.encode([("token", access)]))
        #expect(asClient.status == 401)
        try harness.pool.query("DELETE FROM oidc_tokens WHERE kind = 'access'")
        #expect(try introspect(access).json["active"] as? Bool == false, "revoked or expired")
        let discovery = try harness.send("GET", "/oidc/.well-known/openid-configuration").json
        #expect(discovery["introspection_endpoint"] as? String == ProviderHarness.issuer + "/introspect")
        let metrics = try harness.send("GET", "/metrics").bodyText
        #expect(metrics.contains(#"oidc_introspections_total{outcome="active"} 4"#), "\(metrics)")
    }
}
