import BrokerCrypto
import Foundation
import HTTPClient
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
}
