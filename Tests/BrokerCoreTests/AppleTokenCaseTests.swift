import BrokerAPI
import BrokerCore
import Foundation
import HTTPClient
import HTTPServer
import Observability
import TestSupport
import Testing

/// The 26 Apple-shaped identity tokens of ../shared/testdata/apple, each with a recommended
/// verdict that several popular libraries get wrong, sent through `POST /v1/apple/login`.
@Suite("Apple token cases", .offPool, .enabled(if: TestData.shouldRun, Comment(rawValue: TestData.skipMessage)))
struct AppleTokenCaseTests {
    @Test("every recommended verdict holds through the login API; policy cases get 200 or 4xx, never 5xx")
    func verdicts() throws {
        let file = try AppleTokenCases()
        // Serve the file's JWK Set as Apple's /auth/keys.
        let jwks = Array(file.jwks)
        var router = Router()
        router.get("/auth/keys") { _ in HTTPResponse(status: 200, headers: ["Content-Type": "application/json"], body: jwks) }
        var configuration = HTTPServer.Configuration()
        configuration.listen = "127.0.0.1:0"
        configuration.accessLog = false
        let keys = HTTPServer(
            configuration: configuration, router: router, logger: Logger(label: "k", sink: .capturing()),
            metrics: MetricsRegistry())
        try keys.start()
        defer { keys.shutdown() }

        // The tokens were issued on 2026-01-01: relax the maximum age, as the file asks.
        let broker = try TestBroker(
            extra: ["APPLE_CLIENT_IDS": file.audience, "APPLE_TOKEN_MAX_AGE_SECONDS": String(10 * 365 * 86_400)],
            appleBaseURL: "http://127.0.0.1:\(keys.port)")
        let cases = try file.judged { token in
            let status = try broker.login(["identity_token": token]).status
            return status == 200 ? nil : String(status)
        }
        #expect(cases.filter(\.isWrong).isEmpty, "\(cases.filter(\.isWrong).map { "\($0.name): \($0.verdict ?? "200")" })")
        // A refusal is a 4xx, never a 5xx.
        #expect(cases.allSatisfy { $0.verdict.map { $0.hasPrefix("4") } ?? true }, "\(cases.map { ($0.name, $0.verdict) })")
        // Our documented choices for the three policy cases: all refused.
        let policy = Dictionary(uniqueKeysWithValues: cases.filter { $0.expected == "policy" }.map { ($0.name, $0.verdict) })
        #expect(policy == ["valid_es256": "400", "duplicate_aud_last_is_right": "400", "signature_with_base64_padding": "400"])
    }
}
