import BrokerCrypto
import Foundation
import HTTPClient
import StrictJSON
import TestSupport
import Testing

/// OAuth 2.0 Form Post Response Mode (issue 36 item 6): the answer to the relying party,
/// success or error, is an auto-submitting form POSTed to its redirect URI, under a
/// Content-Security-Policy that admits only the one script by its hash.
@Suite("OpenID Provider form post response mode", .offPool)
struct FormPostTests {
    func request(_ client: ProviderHarness.RegisteredClient, _ extra: [(String, String)] = []) -> [(String, String)] {
        [
            ("response_type", "code"), ("client_id", client.id), ("redirect_uri", client.redirectURI), ("scope", "openid"),
            ("state", "s-<&\"'>"), ("nonce", "n-1"), ("response_mode", "form_post"),
        ] + extra
    }

    /// Checks a form-post page and returns its fields.
    func page(_ answer: SessionBrowser.Answer, to client: ProviderHarness.RegisteredClient) throws -> [String: String] {
        guard case .formPost(let action, let fields, let response) = answer else {
            Issue.record("not a form post: \(answer)")
            throw CancellationError()
        }
        #expect(action == client.redirectURI)
        #expect(response.header("cache-control") == "no-store")
        let policy = try #require(response.header("content-security-policy"))
        let script = try #require(response.bodyText.firstMatch(of: /<script>([^<]*)<\/script>/)).1
        let hash = "sha256-" + Data(SHA256.hash(String(script))).base64EncodedString()
        #expect(policy.contains("script-src '\(hash)'"), "the page's one script, admitted by its hash: \(policy)")
        #expect(!policy.contains("unsafe-inline"))
        #expect(policy.contains("default-src 'none'"))
        #expect(policy.contains("form-action https://rp.example.com;"), "\(policy)")
        #expect(response.bodyText.components(separatedBy: "<script").count == 2, "no other script")
        #expect(fields["state"] == "s-<&\"'>", "state escaped in the page and intact in the form")
        #expect(fields["iss"] == ProviderHarness.issuer)
        return fields
    }

    @Test("after Apple, the code comes as a form post to the redirect URI, and the code works")
    func codeAsFormPost() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let browser = SessionBrowser(harness)
        let (answer, viaApple) = try browser.signIn(request(client))
        #expect(viaApple)
        let fields = try page(answer, to: client)
        let code = try #require(fields["code"])
        let tokens = try harness.token(
            [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)], as: client)
        #expect(tokens.status == 200, "\(tokens.bodyText)")
        // From the session: the same, without Apple.
        let silent = try browser.signIn(request(client, [("prompt", "none")]))
        #expect(!silent.viaApple)
        #expect(try page(silent.0, to: client)["code"] != nil)
    }

    @Test(
        "errors in form_post mode are form posts too: prompt=none without a session, a bad scope; an unknown response_mode goes in the query"
    )
    func errorsAsFormPost() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let browser = SessionBrowser(harness)
        let none = try page(try browser.answer(try browser.authorize(request(client, [("prompt", "none")]))), to: client)
        #expect(none["error"] == "login_required")
        #expect(none["code"] == nil)
        let scope = try page(
            try browser.answer(try browser.authorize(request(client).filter { $0.0 != "scope" } + [("scope", "email")])),
            to: client)
        #expect(scope["error"] == "invalid_scope")
        let unknown = try browser.answer(
            try browser.authorize(request(client).filter { $0.0 != "response_mode" } + [("response_mode", "fragment")]))
        guard case .query(let redirect) = unknown else {
            Issue.record("\(unknown)")
            return
        }
        #expect(redirect.query["error"] == "invalid_request")
        let discovery = try harness.send("GET", "/oidc/.well-known/openid-configuration").json
        #expect(discovery["response_modes_supported"] as? [String] == ["query", "form_post"])
    }
}
