import BrokerCore
import Foundation
import HTTPClient
import JOSE
import PostgresClient
import StrictJSON
import TestSupport
import Testing

@testable import OpenIDProvider

/// RFC 7591 registration, the admin API over registrations, and the provider's settings.
@Suite("OpenID Provider registration and settings", .offPool)
struct RegistrationTests {
    @Test("registration: 201 with client_id, a secret shown once and stored hashed; the admin API reads and deletes")
    func register() throws {
        let harness = try ProviderHarness()
        let response = try harness.register([
            "redirect_uris": ["https://rp.example.com/cb"], "client_name": "RP",
            "backchannel_logout_uri": "http://127.0.0.1:9/logout",
            "backchannel_logout_session_required": true,
        ])
        #expect(response.status == 201, "\(response.bodyText)")
        let id = try #require(response.json["client_id"] as? String)
        let secret = try #require(response.json["client_secret"] as? String)
        #expect(response.json["token_endpoint_auth_method"] as? String == "client_secret_basic")
        #expect(response.json["backchannel_logout_session_required"] as? Bool == true)
        #expect(try harness.count("SELECT count(*) FROM oidc_clients WHERE secret_hash = \(secret)") == 0, "stored hashed")
        let key = try harness.adminKey()
        let read = try harness.send("GET", "/v1/oidc-clients/\(id)", headers: [("Authorization", "Bearer \(key)")])
        #expect(read.status == 200)
        #expect(read.json["client_secret"] == nil, "the secret is shown once")
        #expect(read.json["client_name"] as? String == "RP")
        let listed = try harness.send("GET", "/v1/oidc-clients", headers: [("Authorization", "Bearer \(key)")])
        #expect((listed.json["clients"] as? [[String: Any]])?.count == 1)
        #expect(try harness.send("DELETE", "/v1/oidc-clients/\(id)", headers: [("Authorization", "Bearer \(key)")]).status == 204)
        #expect(try harness.send("GET", "/v1/oidc-clients/\(id)", headers: [("Authorization", "Bearer \(key)")]).status == 404)

        let publicClient = try harness.register(["redirect_uris": ["com.example.app:/cb"], "token_endpoint_auth_method": "none"])
        #expect(publicClient.status == 201, "\(publicClient.bodyText)")
        #expect(publicClient.json["client_secret"] == nil, "public clients get no secret")

        // client_name's maxLength (200) counts characters, as JSON Schema does, not UTF-8 bytes.
        let longName = String(repeating: "é", count: 200)
        let named = try harness.register(["redirect_uris": ["https://rp.example.com/cb"], "client_name": longName])
        #expect(named.status == 201, "200 characters (400 bytes): \(named.bodyText)")
        #expect(named.json["client_name"] as? String == longName)
        let tooLong = try harness.register(["redirect_uris": ["https://rp.example.com/cb"], "client_name": longName + "é"])
        #expect(tooLong.json["error"] as? String == "invalid_client_metadata", "\(tooLong.bodyText)")
    }

    @Test("registration refusals: RFC 7591 codes, and only with an admin key")
    func refusals() throws {
        let harness = try ProviderHarness()
        func error(_ metadata: [String: Any]) throws -> String? {
            let response = try harness.register(metadata)
            #expect(response.status == 400, "\(metadata): \(response.bodyText)")
            return response.json["error"] as? String
        }
        #expect(try error([:]) == "invalid_redirect_uri")
        #expect(try error(["redirect_uris": ["http://rp.example.com/cb"]]) == "invalid_redirect_uri", "plain http off loopback")
        #expect(try error(["redirect_uris": ["https://rp.example.com/cb#frag"]]) == "invalid_redirect_uri")
        #expect(try error(["redirect_uris": ["https://*.example.com/cb"]]) == "invalid_redirect_uri")
        #expect(
            try error(["redirect_uris": ["com.example.app:/cb"]]) == "invalid_redirect_uri", "private-use scheme, confidential")
        #expect(
            try error(["redirect_uris": ["https://rp.example.com/cb"], "token_endpoint_auth_method": "private_key_jwt"])
                == "invalid_client_metadata")
        #expect(
            try error(["redirect_uris": ["https://rp.example.com/cb"], "grant_types": ["implicit"]]) == "invalid_client_metadata")
        #expect(
            try error(["redirect_uris": ["https://rp.example.com/cb"], "response_types": ["token"]]) == "invalid_client_metadata")
        #expect(
            try error(["redirect_uris": ["https://rp.example.com/cb"], "backchannel_logout_uri": "ftp://x"])
                == "invalid_client_metadata")
        #expect(try error(["redirect_uris": "https://rp.example.com/cb"]) == "invalid_client_metadata")

        let readKey = try APIKeyStore(pool: harness.pool).create(name: "read", scopes: [.read]).secret
        #expect(try harness.register(["redirect_uris": ["https://rp.example.com/cb"]], key: readKey).status == 403)
        #expect(try harness.register(["redirect_uris": ["https://rp.example.com/cb"]], key: "abk_nope").status == 401)
        #expect(try harness.count("SELECT count(*) FROM oidc_clients") == 0)
    }

    @Test("backchannel_logout_uri follows the webhook address rules (no private networks unless allowed)")
    func logoutURIRules() throws {
        let harness = try ProviderHarness(extra: ["BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS": "false"])
        let response = try harness.register(
            ["redirect_uris": ["https://rp.example.com/cb"], "backchannel_logout_uri": "https://127.0.0.1/logout"])
        #expect(response.status == 400)
        #expect(response.json["error"] as? String == "invalid_client_metadata")
    }

    @Test("rotation publishes the new key at once and signs with it only after the pre-publication delay")
    func rotation() throws {
        let harness = try ProviderHarness()
        let store = SigningKeyStore(
            pool: harness.pool, tokenKeys: try TokenKeyRing(parsing: harness.environment["TOKEN_ENCRYPTION_KEY"]!))
        let first = try #require(try store.list().first?.kid)
        let next = try store.rotate(prepublish: .seconds(3600))
        #expect(Set(try store.list().map { "\($0.kid)=\($0.state)" }) == ["\(first)=active", "\(next)=pending"])
        let keys = SigningKeys(store: store)
        #expect(try JWKSet(json: try keys.jwks()).keys.compactMap(\.keyID).sorted() == [first, next].sorted())
        let verifier = JWSVerifier(allowedAlgorithms: [.rs256])
        #expect(try verifier.unverifiedHeader(try keys.sign(["sub": "x"])).keyID == first, "the pending key does not sign yet")
        let now = try store.rotate(prepublish: .zero)
        let fresh = SigningKeys(store: store)
        #expect(try verifier.unverifiedHeader(try fresh.sign(["sub": "x"])).keyID == now)
        #expect(try JWKSet(json: try fresh.jwks()).keys.count == 3, "retired keys stay published while their tokens live")
    }

    @Test("a start with an incomplete or contradictory OIDC configuration fails naming the setting")
    func settings() throws {
        let base: [String: String] = [
            "APPLE_TEAM_ID": "TEAMID1234", "APPLE_KEY_ID": "KEYID12345", "APPLE_PRIVATE_KEY_PATH": try TestKeys.privateKeyFile(),
            "APPLE_CLIENT_IDS": "com.example.web", "TOKEN_ENCRYPTION_KEY": Data(repeating: 7, count: 32).base64EncodedString(),
            "BROKER_PUBLIC_URL": "https://broker.example.com", "OIDC_ISSUER": "https://id.example.com",
            "OIDC_APPLE_CLIENT_ID": "com.example.web",
        ]
        let loaded = try BrokerConfiguration.load(environment: base, requireApple: true)
        #expect(loaded.oidc?.issuer == "https://id.example.com")
        #expect(loaded.oidc?.keyPrepublish == .seconds(86_400))
        #expect(loaded.web == nil, "the provider alone needs no APPLE_WEB_RETURN_URLS")
        func problems(_ change: (inout [String: String]) -> Void) -> String {
            var environment = base
            change(&environment)
            do {
                _ = try BrokerConfiguration.load(environment: environment, requireApple: true)
                return ""
            } catch {
                return "\(error)"
            }
        }
        #expect(problems { $0["OIDC_APPLE_CLIENT_ID"] = nil }.contains("OIDC_APPLE_CLIENT_ID"))
        #expect(problems { $0["OIDC_APPLE_CLIENT_ID"] = "com.other" }.contains("OIDC_APPLE_CLIENT_ID"))
        #expect(problems { $0["BROKER_PUBLIC_URL"] = nil }.contains("BROKER_PUBLIC_URL"))
        #expect(problems { $0["OIDC_ISSUER"] = "http://id.example.com" }.contains("OIDC_ISSUER"))
        #expect(problems { $0["OIDC_ISSUER"] = nil }.contains("OIDC_ISSUER"))
        #expect(problems { $0["OIDC_KEY_PREPUBLISH_SECONDS"] = "-1" }.contains("OIDC_KEY_PREPUBLISH_SECONDS"))
        #expect(problems { $0["OIDC_ISSUER"] = "http://127.0.0.1:8080/oidc" } == "", "plain http on loopback")
    }
}

@Suite("OpenID Provider housekeeping", .offPool)
struct ProviderHousekeepingTests {
    @Test("pruning deletes expired codes and tokens and finished grants, and keeps live ones")
    func prune() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        for _ in 0..<2 {
            let code = try #require(
                try harness.signIn([
                    ("response_type", "code"), ("client_id", client.id), ("redirect_uri", client.redirectURI),
                    ("scope", "openid offline_access"),
                ]).query["code"])
            #expect(
                try harness.token(
                    [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)], as: client
                ).status == 200)
        }
        let old = try harness.pool.query("SELECT id FROM oidc_grants ORDER BY created_at LIMIT 1").single().decode(UUID.self, 0)
        try harness.pool.query(
            "UPDATE oidc_grants SET ended_at = now() - interval '2 days', created_at = now() - interval '3 days' WHERE id = \(old)"
        )
        try harness.pool.query("UPDATE oidc_codes SET expires_at = now() - interval '2 hours' WHERE grant_id = \(old)")
        try harness.pool.query("UPDATE oidc_tokens SET expires_at = now() - interval '1 second' WHERE grant_id = \(old)")
        _ = try ProviderHousekeeping(pool: harness.pool, retention: .seconds(60), deadLetterRetention: .seconds(3600)).prune()
        #expect(try harness.count("SELECT count(*) FROM oidc_grants") == 1)
        #expect(try harness.count("SELECT count(*) FROM oidc_grants WHERE id = \(old)") == 0)
        #expect(try harness.count("SELECT count(*) FROM oidc_tokens") == 2, "the live grant keeps its access and refresh tokens")
    }
}
