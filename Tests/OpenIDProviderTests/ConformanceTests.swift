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
}
