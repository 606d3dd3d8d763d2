import BrokerCore
import Foundation
import HTTPClient
import HTTPServer
import Observability
import TestSupport
import Testing

/// The 26 Apple-shaped identity tokens of ../shared/testdata/apple, each with a recommended
/// verdict that several popular libraries get wrong, sent through `POST /v1/apple/login`.
@Suite("Apple token cases", .enabled(if: TestData.isAvailable, Comment(rawValue: TestData.skipMessage)))
struct AppleTokenCaseTests {
    @Test("every recommended verdict holds through the login API; policy cases get 200 or 4xx, never 5xx")
    func verdicts() throws {
        let file = try #require(try TestData.json("apple/apple_id_token_cases.json") as? [String: Any])
        let jwks = try JSONSerialization.data(withJSONObject: file["jwks"]!)
        // Serve the file's JWK Set as Apple's /auth/keys.
        var router = Router()
        router.get("/auth/keys") { _ in HTTPResponse(status: 200, headers: ["Content-Type": "application/json"], body: Array(jwks)) }
        var configuration = HTTPServer.Configuration()
        configuration.listen = "127.0.0.1:0"
        configuration.accessLog = false
        let keys = HTTPServer(configuration: configuration, router: router, logger: Logger(label: "k", sink: .capturing()), metrics: MetricsRegistry())
        try keys.start()
        defer { keys.shutdown() }

        // The tokens were issued on 2026-01-01: relax the maximum age, as the file asks.
        let broker = try TestBroker(
            extra: ["APPLE_CLIENT_IDS": file["audience"] as! String, "APPLE_TOKEN_MAX_AGE_SECONDS": String(10 * 365 * 86_400)],
            appleBaseURL: "http://127.0.0.1:\(keys.port)")
        var wrong: [String] = []
        var policy: [String: Int] = [:]
        for testCase in file["cases"] as! [[String: Any]] {
            let name = testCase["name"] as! String
            let response = try broker.login(["identity_token": testCase["token"] as! String])
            switch testCase["expected"] as! String {
            case "accept" where response.status != 200, "reject" where !(400..<500).contains(response.status):
                wrong.append("\(name): \(response.status) \(response.json["code"] ?? "")")
            case "policy":
                if response.status >= 500 { wrong.append("\(name): \(response.status)") }
                policy[name] = response.status
            default:
                break
            }
        }
        #expect(wrong.isEmpty, "\(wrong)")
        // Our documented choices for the three policy cases: all refused.
        #expect(policy == ["valid_es256": 400, "duplicate_aud_last_is_right": 400, "signature_with_base64_padding": 400])
    }
}
