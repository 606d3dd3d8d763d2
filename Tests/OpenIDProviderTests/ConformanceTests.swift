import BrokerCrypto
import Foundation
import HTTPClient
import PostgresClient
import StrictJSON
import TestSupport
import Testing

/// What a review against the specifications found: each test pins one rule that the first
/// version of the provider did not follow (RFC 6749 §3.1/§3.2, RFC 6750 §2, RFC 7636 §4.1,
/// OpenID Connect Core §3.1.2.1), and malformed input that must end as an OAuth error, never a 500.
@Suite("OpenID Provider conformance", .offPool)
struct ProviderConformanceTests {
    func request(_ client: ProviderHarness.RegisteredClient, scope: String = "openid email", challenge: String? = nil)
        -> [(String, String)]
    {
        var parameters = [
            ("response_type", "code"), ("client_id", client.id), ("redirect_uri", client.redirectURI), ("scope", scope),
            ("state", "s-1"),
        ]
        if let challenge { parameters += [("code_challenge", challenge), ("code_challenge_method", "S256")] }
        return parameters
    }

    func basic(_ client: ProviderHarness.RegisteredClient) -> (String, String) {
        ("Authorization", "Basic " + Data((client.id + ":" + client.secret!).utf8).base64EncodedString())
    }

    @Test("RFC 6749 §3.2: a repeated parameter is invalid_request (not the first value); an empty one counts as omitted")
    func repeatedAndEmptyParameters() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let code = try #require(try harness.signIn(request(client)).query["code"])
        let form = [("Content-Type", "application/x-www-form-urlencoded"), basic(client)]
        let fields = [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)]
        let twice = try harness.send("POST", "/oidc/token", headers: form, body: FormEncoding.encode(fields + [("code", "x")]))
        #expect(twice.status == 400, "\(twice.bodyText)")
        #expect(twice.json["error"] as? String == "invalid_request")
        #expect(twice.header("pragma") == "no-cache", "RFC 6749 §5.2: refusals are not cached either")
        #expect(twice.header("cache-control") == "no-store")
        // The refusal spent nothing; §3.1: `code_verifier=` and `client_secret=` without a value are omitted.
        let empty = try harness.send(
            "POST", "/oidc/token", headers: form,
            body: FormEncoding.encode(fields + [("code_verifier", ""), ("client_secret", "")]))
        #expect(empty.status == 200, "\(empty.bodyText)")
        #expect(empty.header("pragma") == "no-cache")
        let revoke = try harness.send(
            "POST", "/oidc/revoke", headers: form, body: FormEncoding.encode([("token", "a"), ("token", "b")]))
        #expect(revoke.status == 400)
        #expect(revoke.json["error"] as? String == "invalid_request")
    }

    @Test(
        "RFC 6749 §3.1: parameters an endpoint does not read are ignored, repeated or holding a NUL byte (token, revoke, introspect)"
    )
    func unreadParametersIgnored() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let code = try #require(try harness.signIn(request(client)).query["code"])
        let form = [("Content-Type", "application/x-www-form-urlencoded"), basic(client)]
        // What schemathesis sent: a name the endpoint does not know, three times; and a NUL in another.
        let unread = [("x_extra", "1"), ("x_extra", "true"), ("x_extra", "-244"), ("x_nul", "a\u{0}b")]
        let fields = [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)]
        let tokens = try harness.send("POST", "/oidc/token", headers: form, body: FormEncoding.encode(fields + unread))
        #expect(tokens.status == 200, "\(tokens.bodyText)")
        let access = try #require(tokens.json["access_token"] as? String)
        // token_type_hint is read at /revoke but not at /token: repeated there, it is ignored too.
        let hinted = try harness.send(
            "POST", "/oidc/token", headers: form,
            body: FormEncoding.encode([("grant_type", "refresh_token"), ("token_type_hint", "a"), ("token_type_hint", "b")]))
        #expect(hinted.json["error"] as? String == "invalid_request", "\(hinted.bodyText)")
        #expect((hinted.json["error_description"] as? String)?.contains("refresh_token") == true, "\(hinted.bodyText)")

        let key = try harness.adminKey()
        let created = try harness.send(
            "POST", "/v1/oidc-resource-servers",
            headers: [("Authorization", "Bearer \(key)"), ("Content-Type", "application/json")],
            body: #"{"client_ids":["\#(client.id)"]}"#)
        let serverID = try #require(created.json["resource_server_id"] as? String)
        let secret = try #require(created.json["secret"] as? String)
        let introspected = try harness.send(
            "POST", "/oidc/introspect", headers: [("Content-Type", "application/x-www-form-urlencoded")],
            body: FormEncoding.encode(
                [("token", access), ("client_id", serverID), ("client_secret", secret), ("client_assertion", "x")] + unread))
        #expect(introspected.status == 200, "\(introspected.bodyText)")
        #expect(introspected.json["active"] as? Bool == true)

        let revoked = try harness.send(
            "POST", "/oidc/revoke", headers: form, body: FormEncoding.encode([("token", access)] + unread))
        #expect(revoked.status == 200, "\(revoked.bodyText)")
        // A parameter the endpoint reads is still refused when repeated or holding a NUL byte.
        let twice = try harness.send(
            "POST", "/oidc/introspect", headers: [("Content-Type", "application/x-www-form-urlencoded")],
            body: FormEncoding.encode([("token", access), ("token", "b"), ("client_id", serverID), ("client_secret", secret)]))
        #expect(twice.status == 400 && twice.json["error"] as? String == "invalid_request", "\(twice.bodyText)")
        let nul = try harness.send(
            "POST", "/oidc/introspect", headers: [("Content-Type", "application/x-www-form-urlencoded")],
            body: FormEncoding.encode([("token", "a\u{0}"), ("client_id", serverID), ("client_secret", secret)]))
        #expect(nul.status == 400 && nul.json["error"] as? String == "invalid_request", "\(nul.bodyText)")
    }

    @Test(
        "a body over BROKER_MAX_BODY_BYTES at the provider's endpoints is their RFC error (invalid_request), not a 413 problem document"
    )
    func oversizedBodies() throws {
        let harness = try ProviderHarness(extra: ["BROKER_MAX_BODY_BYTES": "1024"])
        let big = "token=" + String(repeating: "a", count: 4096)
        let form = [("Content-Type", "application/x-www-form-urlencoded")]
        for path in ["/oidc/token", "/oidc/revoke", "/oidc/introspect", "/oidc/register"] {
            for chunked in [false, true] {
                let answer = try harness.send(
                    "POST", path, headers: form + (chunked ? [("Transfer-Encoding", "chunked")] : []), body: big)
                #expect(answer.status == 400, "\(path) chunked: \(chunked): \(answer.status) \(answer.bodyText)")
                #expect(answer.header("content-type") == "application/json", "\(path)")
                #expect(answer.json["error"] as? String == "invalid_request", "\(path): \(answer.bodyText)")
                #expect(answer.header("cache-control") == "no-store", "\(path)")
            }
        }
        let userinfo = try harness.send("POST", "/oidc/userinfo", headers: form, body: big)
        #expect(userinfo.status == 400)
        #expect(userinfo.header("www-authenticate")?.contains(#"error="invalid_request""#) == true)
        for path in ["/oidc/authorize", "/oidc/logout", "/oidc/logout/confirm"] {
            let page = try harness.send("POST", path, headers: form, body: big)
            #expect(page.status == 400 && page.header("content-type")?.hasPrefix("text/html") == true, "\(path): \(page.status)")
        }
        // The rest of the API keeps its problem document.
        let login = try harness.send("POST", "/v1/apple/login", headers: [("Content-Type", "application/json")], body: big)
        #expect(login.status == 413)
        #expect(login.header("content-type") == "application/problem+json")
    }

    @Test("RFC 7636 §4.1: a code_verifier outside [A-Za-z0-9-._~] is invalid_request even when its hash matches")
    func verifierCharacters() throws {
        let harness = try ProviderHarness()
        let native = try harness.publicClient()
        let verifier = String(repeating: "a", count: 42) + "/"
        let challenge = Base64URL.encode(SHA256.hash(verifier))
        let code = try #require(try harness.signIn(request(native, challenge: challenge)).query["code"])
        let answer = try harness.token(
            [
                ("grant_type", "authorization_code"), ("code", code), ("redirect_uri", native.redirectURI),
                ("code_verifier", verifier),
            ], as: native)
        #expect(answer.status == 400, "\(answer.bodyText)")
        #expect(answer.json["error"] as? String == "invalid_request")
    }

    @Test(
        "OpenID Connect Core §3.1.2.1: unknown scope values are ignored; a known one the client did not register is invalid_scope"
    )
    func unknownScopesIgnored() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient(extra: ["scope": "openid email"])
        let code = try #require(try harness.signIn(request(client, scope: "openid email groups")).query["code"])
        let tokens = try harness.token(
            [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)], as: client)
        #expect(tokens.status == 200, "\(tokens.bodyText)")
        #expect(tokens.json["scope"] as? String == "openid email")
        let refused = try ProviderHarness.Redirect(try harness.authorize(request(client, scope: "openid profile")))
        #expect(refused.query["error"] == "invalid_scope")
    }

    @Test("RFC 6749 §5.2: an over-long code or refresh token is invalid_grant, like any unknown one, not invalid_request")
    func overLongGrants() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let long = String(repeating: "c", count: 300)
        let code = try harness.token(
            [("grant_type", "authorization_code"), ("code", long), ("redirect_uri", client.redirectURI)], as: client)
        #expect(code.json["error"] as? String == "invalid_grant", "\(code.bodyText)")
        let refresh = try harness.token([("grant_type", "refresh_token"), ("refresh_token", long)], as: client)
        #expect(refresh.json["error"] as? String == "invalid_grant", "\(refresh.bodyText)")
    }

    @Test("an incomplete answer from Apple is server_error to the RP, with state and iss, and counted as server_error")
    func incompleteAppleAnswer() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let browser = SessionBrowser(harness)
        let toApple = try ProviderHarness.Redirect(try browser.authorize(request(client)))
        let sealed = try #require(toApple.query["state"])
        let posted = try browser.post("/v1/apple/web/callback", form: [("state", sealed), ("code", "c")])
        let back = try ProviderHarness.Redirect(posted)
        #expect(back.base == client.redirectURI)
        #expect(back.query["error"] == "server_error")
        #expect(back.query["state"] == "s-1")
        #expect(back.query["iss"] == ProviderHarness.issuer)
        let metrics = try harness.send("GET", "/metrics").bodyText
        #expect(metrics.contains(#"oidc_authorizations_total{outcome="server_error"} 1"#), "\(metrics)")
    }

    @Test("RFC 6749 §5.2: an error_description quoting what the client sent holds only the allowed ASCII characters")
    func descriptionCharacters() throws {
        let harness = try ProviderHarness()
        let response = try harness.register(["redirect_uris": ["https://rp.example.com/é\"\\#x"]])
        #expect(response.json["error"] as? String == "invalid_redirect_uri")
        let description = try #require(response.json["error_description"] as? String)
        #expect(
            description.unicodeScalars.allSatisfy { (0x20...0x7E).contains($0.value) && $0 != "\"" && $0 != "\\" },
            "\(description)")
        #expect(description.contains("rp.example.com"))
    }

    @Test("sub is the broker's user_id: the same for one Apple user at two RPs (a public subject type)")
    func subAcrossRelyingParties() throws {
        let harness = try ProviderHarness()
        func sub(_ client: ProviderHarness.RegisteredClient, sim: [(String, String)] = []) throws -> String {
            let code = try #require(try harness.signIn(request(client), sim: sim).query["code"])
            let answer = try harness.token(
                [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)], as: client)
            let claims = try harness.verifiedClaims(try #require(answer.json["id_token"] as? String))
            return try #require(claims["sub"]?.stringValue)
        }
        let first = try sub(try harness.confidentialClient())
        let appleSub = try harness.pool.query(
            "SELECT sub FROM apple_identities WHERE user_id = \(try #require(UUID(uuidString: first)))"
        ).single().decode(String.self, "sub")
        let second = try sub(
            try harness.confidentialClient(redirectURI: "https://other-rp.example.com/cb"), sim: [("sim_sub", appleSub)])
        #expect(second == first)
        #expect(first != appleSub, "the broker's user_id, not Apple's team-scoped sub")
    }

    @Test(
        "RFC 6749 §3.1 at the authorization endpoint: a repeated parameter is invalid_request; a repeated client_id or redirect_uri gets a page"
    )
    func repeatedAuthorizeParameters() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let nonce = try ProviderHarness.Redirect(try harness.authorize(request(client) + [("nonce", "a"), ("nonce", "b")]))
        #expect(nonce.base == client.redirectURI && nonce.query["error"] == "invalid_request")
        #expect(nonce.query["state"] == "s-1" && nonce.query["iss"] != nil)
        let state = try ProviderHarness.Redirect(try harness.authorize(request(client) + [("state", "s-2")]))
        #expect(state.query["error"] == "invalid_request" && state.query["state"] == nil, "which state would be the RP's?")
        for name in ["client_id", "redirect_uri"] {
            let page = try harness.authorize(request(client) + [(name, name == "client_id" ? client.id : client.redirectURI)])
            #expect(page.status == 400 && page.header("location") == nil, "\(name)")
        }
    }

    @Test("OpenID Connect Core §3.1.2.1: prompt=none with another value is invalid_request; alone, login_required")
    func promptNoneAlone() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        func error(_ prompt: String) throws -> String? {
            try ProviderHarness.Redirect(try harness.authorize(request(client) + [("prompt", prompt)])).query["error"]
        }
        #expect(try error("none login") == "invalid_request")
        #expect(try error("none") == "login_required")
    }

    @Test("RFC 6750 §2: an access token in the header and in the body is invalid_request")
    func userinfoTwoMethods() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let code = try #require(try harness.signIn(request(client)).query["code"])
        let access = try #require(
            try harness.token(
                [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)], as: client
            ).json["access_token"] as? String)
        let both = try harness.send(
            "POST", "/oidc/userinfo",
            headers: [("Authorization", "Bearer \(access)"), ("Content-Type", "application/x-www-form-urlencoded")],
            body: FormEncoding.encode([("access_token", access)]))
        #expect(both.status == 400, "\(both.bodyText)")
        #expect(both.header("www-authenticate")?.contains(#"error="invalid_request""#) == true)
        #expect(try harness.send("GET", "/oidc/userinfo", headers: [("Authorization", "Bearer \(access)")]).status == 200)
    }

    @Test("malformed input is an OAuth error or a page, never a 500: NUL bytes, bad UTF-8, over-long values")
    func malformedInput() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let long = String(repeating: "x", count: 5000)
        for clientID in ["oidc_%00x", "%FF%FE", long] {
            let page = try harness.send("GET", "/oidc/authorize?response_type=code&client_id=\(clientID)")
            #expect(page.status == 400, "\(clientID.prefix(20)): \(page.status)")
        }
        let form = [("Content-Type", "application/x-www-form-urlencoded")]
        for body in [
            "grant_type=authorization_code&client_id=oidc_%00x&code=c&redirect_uri=x",
            "grant_type=authorization_code&client_id=%FF%FE&code=c&redirect_uri=x",
            "grant_type=authorization_code&client_id=\(client.id)&client_secret=%00&code=%00&redirect_uri=%00",
            "grant_type=refresh_token&client_id=\(client.id)&client_secret=\(client.secret!)&refresh_token=%00%FF",
            "grant_type=authorization_code&client_id=\(long)&code=\(long)&redirect_uri=\(long)",
        ] {
            let answer = try harness.send("POST", "/oidc/token", headers: form, body: body)
            #expect([400, 401].contains(answer.status), "\(body.prefix(80)): \(answer.status) \(answer.bodyText)")
            #expect(answer.json["error"] is String)
        }
        // RFC 7009 §2.2: an unknown token (bad UTF-8, an unknown hint) is 200; a NUL byte is invalid_request.
        let revoke = try harness.send(
            "POST", "/oidc/revoke", headers: form + [basic(client)], body: "token=%FF%FE&token_type_hint=id_token")
        #expect(revoke.status == 200, "\(revoke.bodyText)")
        let nul = try harness.send("POST", "/oidc/revoke", headers: form + [basic(client)], body: "token=a%00")
        #expect(nul.json["error"] as? String == "invalid_request")
        let userinfo = try harness.send(
            "POST", "/oidc/userinfo", headers: form, body: "access_token=%00%FF")
        #expect(userinfo.status == 401)
        let basicNUL = try harness.send(
            "POST", "/oidc/token",
            headers: form + [("Authorization", "Basic " + Data("oidc_%00:x".utf8).base64EncodedString())],
            body: "grant_type=authorization_code&code=c&redirect_uri=x")
        #expect(basicNUL.status == 401, "\(basicNUL.bodyText)")
        let admin = [("Authorization", "Bearer \(try harness.adminKey())")]
        #expect(try harness.send("GET", "/v1/oidc-clients/oidc_%00x", headers: admin).status == 404)
        #expect(try harness.send("DELETE", "/v1/oidc-clients/oidc_%00x", headers: admin).status == 404)
        let register = try harness.register(["redirect_uris": ["https://rp.example.com/\u{0}"]])
        #expect(register.status == 400)
        #expect(register.json["error"] as? String == "invalid_client_metadata")
    }
}
