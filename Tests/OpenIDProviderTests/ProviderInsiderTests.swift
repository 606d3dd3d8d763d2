import BrokerCore
import Foundation
import HTTPClient
import PostgresClient
import StrictJSON
import TestSupport
import Testing

@testable import OpenIDProvider

/// Insiders and success paths (issue 36 items 2, 3, 9, 10): limited admin keys and the audit
/// log, RFC 7591/6750 refusals at /register, metering, bounded refresh rotation, CORS,
/// preferred_username, and the home-lab redirect opt-in.
@Suite("OpenID Provider insiders and success paths", .offPool)
struct ProviderInsiderTests {
    func codeRequest(_ client: ProviderHarness.RegisteredClient, scope: String = "openid email profile offline_access")
        -> [(String, String)]
    {
        [
            ("response_type", "code"), ("client_id", client.id), ("redirect_uri", client.redirectURI), ("scope", scope),
            ("state", "s"), ("nonce", "n"),
        ]
    }

    func tokens(
        _ harness: ProviderHarness, _ client: ProviderHarness.RegisteredClient,
        scope: String = "openid email profile offline_access"
    ) throws -> [String: Any] {
        let code = try #require(try harness.signIn(codeRequest(client, scope: scope)).query["code"])
        let answer = try harness.token(
            [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)], as: client)
        #expect(answer.status == 200, "\(answer.bodyText)")
        return answer.json
    }

    func audit(_ harness: ProviderHarness, _ action: String) throws -> [(actor: String, detail: String)] {
        try harness.pool.query("SELECT actor, detail::text AS detail FROM audit_log WHERE action = \(action) ORDER BY id").map {
            (try $0.decode(String.self, "actor"), try $0.decode(String.self, "detail"))
        }
    }

    @Test(
        "admin routes: a key limited to other apps is refused everywhere (and audited); one reaching the provider's app works, audited"
    )
    func limitedKeys() throws {
        let harness = try ProviderHarness()
        let store = APIKeyStore(pool: harness.pool)
        let outside = try store.create(name: "app only", scopes: [.admin], clientIDs: ["com.example.app"])
        let inside = try store.create(name: "provider", scopes: [.admin], clientIDs: [ProviderHarness.appleClientID])
        let client = try harness.confidentialClient()
        func call(_ method: String, _ path: String, _ key: String, body: String? = nil) throws -> HTTPClientResponse {
            try harness.send(
                method, path, headers: [("Authorization", "Bearer \(key)"), ("Content-Type", "application/json")], body: body)
        }
        for (method, path, body) in [
            ("GET", "/v1/oidc-clients", nil), ("GET", "/v1/oidc-clients/\(client.id)", nil),
            ("DELETE", "/v1/oidc-clients/\(client.id)", nil), ("POST", "/v1/oidc-keys/rotate", nil),
            ("GET", "/v1/oidc-keys", nil), ("GET", "/v1/oidc-logout-deliveries", nil),
            ("POST", "/v1/oidc-logout-deliveries/1/retry", nil),
            ("POST", "/v1/oidc-resource-servers", #"{"client_ids":["\#(client.id)"]}"#),
        ] as [(String, String, String?)] {
            let answer = try call(method, path, outside.secret, body: body)
            #expect(answer.status == 403, "\(method) \(path): \(answer.bodyText)")
            #expect(answer.json["code"] as? String == "client_not_allowed", "\(method) \(path)")
        }
        let register = try harness.register(["redirect_uris": ["https://rp.example.com/cb"]], key: outside.secret)
        #expect(register.status == 403 && register.json["error"] as? String == "insufficient_scope", "\(register.bodyText)")
        #expect(register.header("www-authenticate")?.hasPrefix("Bearer error=\"insufficient_scope\"") == true)
        #expect(try harness.count("SELECT count(*) FROM oidc_clients") == 1, "nothing registered")
        #expect(try harness.count("SELECT count(*) FROM oidc_signing_keys") == 1, "no key rotated")
        let refusals = try harness.pool.query(
            "SELECT count(*) AS n FROM audit_log WHERE actor = \("api:" + outside.key.id) AND detail->>'outcome' = 'refused_client_not_allowed'"
        ).single().decode(Int.self, "n")
        #expect(refusals == 9, "every refusal is audited")

        // A key that reaches the provider's Services ID manages it; each act is audited.
        let registered = try harness.register(["redirect_uris": ["https://rp.example.com/cb"]], key: inside.secret)
        #expect(registered.status == 201)
        let id = try #require(registered.json["client_id"] as? String)
        #expect(try call("POST", "/v1/oidc-keys/rotate", inside.secret).status == 201)
        #expect(try call("DELETE", "/v1/oidc-clients/\(id)", inside.secret).status == 204)
        let actor = "api:" + inside.key.id
        #expect(try audit(harness, "oidc_client.created").contains { $0.actor == actor && $0.detail.contains(id) })
        #expect(try audit(harness, "oidc_client.deleted").contains { $0.actor == actor && $0.detail.contains(id) })
        #expect(try audit(harness, "oidc_signing_key.rotated").contains { $0.actor == actor })
        // Each row's audit columns name the act's target and outcome (issue 38, item 5), a
        // deletion of nothing too; the refusals are refused.
        #expect(try call("DELETE", "/v1/oidc-clients/\(id)", inside.secret).status == 404)
        let columns = try harness.pool.query(
            "SELECT concat_ws(' ', action, target, outcome) FROM audit_log WHERE actor = \(actor) ORDER BY id"
        ).map { try $0.decode(String.self, 0) }
        #expect(columns.contains("oidc_client.created oidc_client:\(id) succeeded"), "\(columns)")
        #expect(columns.contains("oidc_client.deleted oidc_client:\(id) succeeded"), "\(columns)")
        #expect(columns.contains("oidc_client.deleted oidc_client:\(id) failed"), "\(columns)")
        #expect(columns.contains { $0.hasPrefix("oidc_signing_key.rotated oidc_signing_key:") && $0.hasSuffix(" succeeded") })
        let refused = try harness.pool.query(
            "SELECT concat_ws(' ', target, outcome) FROM audit_log WHERE actor = \("api:" + outside.key.id) ORDER BY id"
        ).map { try $0.decode(String.self, 0) }
        #expect(refused.count == 9 && refused.allSatisfy { $0 == "refused" || $0.hasSuffix(" refused") }, "\(refused)")
        #expect(refused.contains("oidc_client:\(client.id) refused"), "\(refused)")
        let keys = try call("GET", "/v1/oidc-keys", inside.secret)
        #expect((keys.json["keys"] as? [[String: Any]])?.count == 2)
        // No secret or personal data in the audit rows.
        let rows = try harness.pool.query("SELECT detail::text AS d FROM audit_log").map { try $0.decode(String.self, "d") }
        #expect(!rows.contains { $0.contains(registered.json["client_secret"] as? String ?? "-") || $0.contains("@") })
    }

    @Test(
        "/register refusals: RFC 6750 invalid_token with WWW-Authenticate for a missing or bad key, insufficient_scope, no problem documents"
    )
    func registrationRefusals() throws {
        let harness = try ProviderHarness()
        let body = #"{"redirect_uris":["https://rp.example.com/cb"]}"#
        let missing = try harness.send("POST", "/oidc/register", headers: [("Content-Type", "application/json")], body: body)
        #expect(missing.status == 401)
        #expect(missing.json["error"] as? String == "invalid_token")
        #expect(missing.header("www-authenticate")?.hasPrefix("Bearer error=\"invalid_token\"") == true)
        #expect(missing.header("content-type")?.hasPrefix("application/json") == true, "not application/problem+json")
        let bad = try harness.register(["redirect_uris": ["https://rp.example.com/cb"]], key: "abk_nope")
        #expect(bad.status == 401 && bad.json["error"] as? String == "invalid_token")
        #expect(bad.header("www-authenticate")?.contains("invalid_token") == true)
        let readKey = try APIKeyStore(pool: harness.pool).create(name: "read", scopes: [.read]).secret
        let scope = try harness.register(["redirect_uris": ["https://rp.example.com/cb"]], key: readKey)
        #expect(scope.status == 403 && scope.json["error"] as? String == "insufficient_scope")
        let notJSON = try harness.send(
            "POST", "/oidc/register", headers: [("Authorization", "Bearer \(try harness.adminKey())")], body: "x")
        #expect(notJSON.json["error"] as? String != nil, "an OAuth error: \(notJSON.bodyText)")
    }

    @Test("success paths are metered per client and grant type; /revoke is metered; client labels are bounded")
    func metering() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let issued = try tokens(harness, client)
        let refreshed = try harness.token(
            [("grant_type", "refresh_token"), ("refresh_token", try #require(issued["refresh_token"] as? String))], as: client)
        #expect(refreshed.status == 200)
        let revoke = try harness.send(
            "POST", "/oidc/revoke", headers: [("Content-Type", "application/x-www-form-urlencoded")],
            body: FormEncoding.encode([
                ("token", try #require(refreshed.json["access_token"] as? String)), ("client_id", client.id),
                ("client_secret", client.secret!),
            ]))
        #expect(revoke.status == 200)
        _ = try harness.send(
            "POST", "/oidc/revoke", headers: [("Content-Type", "application/x-www-form-urlencoded")],
            body: FormEncoding.encode([("token", "x"), ("client_id", client.id), ("client_secret", "wrong")]))
        let metrics = try harness.send("GET", "/metrics").bodyText
        #expect(
            metrics.contains(#"oidc_tokens_issued_total{client_id="\#(client.id)",grant_type="authorization_code"} 1"#),
            "\(metrics)")
        #expect(metrics.contains(#"oidc_tokens_issued_total{client_id="\#(client.id)",grant_type="refresh_token"} 1"#))
        #expect(metrics.contains(#"oidc_revocations_total{outcome="success"} 1"#))
        #expect(metrics.contains(#"oidc_revocations_total{outcome="invalid_client"} 1"#))

        let labels = ClientLabels(maximum: 3)
        #expect(["a", "b", "c", "d", "a", "e"].map(labels.label) == ["a", "b", "c", "other", "a", "other"])
    }

    @Test("refresh rotation keeps a bounded number of used tokens per grant; a replay of a recent one still ends the grant")
    func refreshRotationBounded() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        var refresh = try #require(try tokens(harness, client)["refresh_token"] as? String)
        var previous = refresh
        for _ in 0..<(ProviderPolicy.usedRefreshTokensKept + 8) {
            let answer = try harness.token([("grant_type", "refresh_token"), ("refresh_token", refresh)], as: client)
            #expect(answer.status == 200, "\(answer.bodyText)")
            previous = refresh
            refresh = try #require(answer.json["refresh_token"] as? String)
        }
        let rows = try harness.count("SELECT count(*) FROM oidc_tokens WHERE kind = 'refresh'")
        #expect(rows == ProviderPolicy.usedRefreshTokensKept + 1, "the kept used ones and the live one: \(rows)")
        let replay = try harness.token([("grant_type", "refresh_token"), ("refresh_token", previous)], as: client)
        #expect(replay.json["error"] as? String == "invalid_grant")
        let live = try harness.token([("grant_type", "refresh_token"), ("refresh_token", refresh)], as: client)
        #expect(live.json["error"] as? String == "invalid_grant", "reuse detection ended the grant")
    }

    @Test(
        "CORS on /token, /userinfo and /revoke for origins of registered redirect URIs: preflight, Vary, never * or credentials")
    func cors() throws {
        let harness = try ProviderHarness()
        let spa = try harness.confidentialClient(method: "none", redirectURI: "https://spa.example.com/callback")
        _ = try harness.confidentialClient(method: "none", redirectURI: "http://127.0.0.1/callback")
        func preflight(_ path: String, origin: String) throws -> HTTPClientResponse {
            try harness.send(
                "OPTIONS", path,
                headers: [
                    ("Origin", origin), ("Access-Control-Request-Method", "POST"),
                    ("Access-Control-Request-Headers", "content-type, authorization"),
                ])
        }
        for path in ["/oidc/token", "/oidc/userinfo", "/oidc/revoke"] {
            let allowed = try preflight(path, origin: "https://spa.example.com")
            #expect(allowed.status == 204, "\(path)")
            #expect(allowed.header("access-control-allow-origin") == "https://spa.example.com", "\(path)")
            #expect(allowed.header("access-control-allow-methods")?.contains("POST") == true)
            #expect(allowed.header("access-control-allow-headers")?.contains("Authorization") == true)
            #expect(allowed.header("access-control-allow-credentials") == nil)
            #expect(allowed.header("vary")?.contains("Origin") == true)
            let refused = try preflight(path, origin: "https://evil.example.com")
            #expect(refused.header("access-control-allow-origin") == nil, "\(path)")
            #expect(refused.header("vary")?.contains("Origin") == true)
        }
        #expect(
            try preflight("/oidc/token", origin: "http://127.0.0.1:5173").header("access-control-allow-origin")
                == "http://127.0.0.1:5173", "loopback: any port")
        #expect(try preflight("/oidc/token", origin: "https://spa.example.com:8443").header("access-control-allow-origin") == nil)
        #expect(try preflight("/oidc/token", origin: "null").header("access-control-allow-origin") == nil)
        // Any Origin is answered 204 (the description's contract); one over 300 characters is never allowed.
        let long = try preflight("/oidc/token", origin: "https://spa.example.com" + String(repeating: "0", count: 300))
        #expect(long.status == 204 && long.header("access-control-allow-origin") == nil)
        // The actual requests carry the origin too, refusals included (the app reads the error).
        let token = try harness.send(
            "POST", "/oidc/token",
            headers: [("Origin", "https://spa.example.com"), ("Content-Type", "application/x-www-form-urlencoded")],
            body: FormEncoding.encode([("grant_type", "authorization_code"), ("code", "x"), ("client_id", spa.id)]))
        #expect(token.status == 400)
        #expect(token.header("access-control-allow-origin") == "https://spa.example.com")
        let userinfo = try harness.send(
            "GET", "/oidc/userinfo", headers: [("Origin", "https://spa.example.com"), ("Authorization", "Bearer x")])
        #expect(userinfo.status == 401)
        #expect(userinfo.header("access-control-allow-origin") == "https://spa.example.com")
        #expect(userinfo.header("access-control-expose-headers")?.contains("WWW-Authenticate") == true)
        // A registration made now is an allowed origin at once on this replica.
        _ = try harness.confidentialClient(redirectURI: "https://new.example.com/cb")
        #expect(
            try preflight("/oidc/token", origin: "https://new.example.com").header("access-control-allow-origin")
                == "https://new.example.com")
    }

    @Test("preferred_username under profile: the e-mail with the email scope, else the sub")
    func preferredUsername() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let both = try tokens(harness, client, scope: "openid email profile")
        let claims = try harness.verifiedClaims(try #require(both["id_token"] as? String))
        #expect(claims["preferred_username"]?.stringValue == claims["email"]?.stringValue)
        #expect(claims["preferred_username"]?.stringValue?.contains("@") == true)
        let profileOnly = try tokens(harness, client, scope: "openid profile")
        let profileClaims = try harness.verifiedClaims(try #require(profileOnly["id_token"] as? String))
        #expect(
            profileClaims["preferred_username"]?.stringValue == profileClaims["sub"]?.stringValue, "no e-mail without its scope")
        let info = try harness.send(
            "GET", "/oidc/userinfo",
            headers: [("Authorization", "Bearer \(try #require(profileOnly["access_token"] as? String))")])
        #expect(info.json["preferred_username"] as? String == profileClaims["sub"]?.stringValue)
        let openidOnly = try tokens(harness, client, scope: "openid")
        #expect(try harness.verifiedClaims(try #require(openidOnly["id_token"] as? String))["preferred_username"] == nil)
    }

    @Test("plain-http redirect URIs to private-network hosts only with the admin's per-client opt-in")
    func privateNetworkHTTP() throws {
        let harness = try ProviderHarness()
        func register(_ uri: String, optIn: Bool) throws -> HTTPClientResponse {
            try harness.register(["redirect_uris": [uri], "private_network_http_redirects": optIn])
        }
        for uri in ["http://192.168.1.20:8123/auth/external/callback", "http://nas.home.arpa/cb", "http://100.101.102.103/cb"] {
            let refused = try register(uri, optIn: false)
            #expect(refused.status == 400 && refused.json["error"] as? String == "invalid_redirect_uri", "\(uri)")
            let accepted = try register(uri, optIn: true)
            #expect(accepted.status == 201, "\(uri): \(accepted.bodyText)")
            #expect(accepted.json["private_network_http_redirects"] as? Bool == true)
        }
        for uri in [
            "http://8.8.8.8/cb", "http://rp.example.com/cb", "http://2130706433/cb", "http://192.168.1.20@evil.example/cb",
        ] {
            let refused = try register(uri, optIn: true)
            #expect(
                refused.status == 400 && refused.json["error"] as? String == "invalid_redirect_uri", "\(uri): \(refused.bodyText)"
            )
        }
        // The whole flow ends at the home-lab address.
        let opted = try register("http://192.168.1.20:8123/auth/external/callback", optIn: true)
        let client = ProviderHarness.RegisteredClient(
            id: try #require(opted.json["client_id"] as? String), secret: opted.json["client_secret"] as? String,
            redirectURI: "http://192.168.1.20:8123/auth/external/callback")
        let back = try harness.signIn(codeRequest(client))
        #expect(back.base == client.redirectURI)
        #expect(back.query["code"] != nil)
        #expect(try audit(harness, "oidc_client.created").contains { $0.detail.contains("private_network_http_redirects") })
    }
}
