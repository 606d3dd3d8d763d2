import BrokerCore
import Foundation
import HTTPClient
import Testing
import TestSupport

@Suite("OpenAPI description")
struct OpenAPITests {
    @Test("every route the router knows is described, and every described operation is a route")
    func routesMatch() throws {
        let broker = try TestBroker()
        let response = try broker.get("/openapi.json")
        #expect(response.status == 200)
        let document = try #require(try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any])
        #expect(document["openapi"] as? String == "3.1.0")
        let paths = try #require(document["paths"] as? [String: [String: Any]])
        var described = Set<String>()
        for (path, operations) in paths {
            for method in operations.keys where ["get", "post", "put", "patch", "delete"].contains(method) {
                described.insert("\(method.uppercased()) \(path)")
            }
        }
        let served = Set(broker.application.routes)
        #expect(served.subtracting(described).isEmpty, "undescribed routes: \(served.subtracting(described).sorted())")
        #expect(described.subtracting(served).isEmpty, "described but not served: \(described.subtracting(served).sorted())")
    }

    @Test("every problem code the code can answer with is documented")
    func problemCodes() throws {
        // Collect `code: "…"` literals from the sources and look for each in the description.
        let root = Repository.root
        let description = try Repository.text("docs/openapi.json")
        var codes = Set<String>()
        let enumerator = FileManager.default.enumerator(at: root.appendingPathComponent("Sources"), includingPropertiesForKeys: nil)!
        let pattern = try NSRegularExpression(pattern: #"code: "([a-z_]+)""#)
        // The simulator answers as Apple does, and the client library names its own local errors.
        for case let file as URL in enumerator
        where file.pathExtension == "swift" && !file.path.contains("AppleSimulator") && !file.path.contains("/AppleIDBrokerClient/") {
            let text = try String(contentsOf: file, encoding: .utf8)
            for match in pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                codes.insert(String(text[Range(match.range(at: 1), in: text)!]))
            }
        }
        for code in ["token_expired", "token_signature_invalid", "unknown_key", "nonce_mismatch"] { codes.insert(code) }
        #expect(codes.count > 20)
        let missing = codes.filter { !description.contains("`\($0)`") }
        #expect(missing.isEmpty, "undocumented problem codes: \(missing.sorted())")
    }

    @Test("the webhook URL pattern in the description is the rule the server applies")
    func webhookURLPattern() throws {
        let broker = try TestBroker()
        let admin = try broker.key([.admin])
        let document = try #require(try JSONSerialization.jsonObject(with: Data(broker.get("/openapi.json").body)) as? [String: Any])
        let schemas = try #require((document["components"] as? [String: Any])?["schemas"] as? [String: Any])
        let url = try #require(((schemas["SubscriptionRequest"] as? [String: Any])?["properties"] as? [String: Any])?["url"] as? [String: Any])
        let pattern = try NSRegularExpression(pattern: try #require(url["pattern"] as? String))
        let samples = [
            "https://hooks.example.com/appleid?team=a&x=%20", "https://0", "http://localhost:6/_ys/a*", "http://[::1]:8080/h",
            "http://127.0.0.1/", "http://example.com/hook", "https://user:pw@example.com/", "https://example.com/#frag",
            "https://example.com/a b", "https://example.com/%zz", "ftp://example.com/", "https://-bad.example/",
        ]
        for sample in samples {
            let described = pattern.firstMatch(in: sample, range: NSRange(sample.startIndex..., in: sample)) != nil
            let body = String(decoding: try JSONSerialization.data(withJSONObject: ["url": sample, "topics": ["*"]]), as: UTF8.self)
            let status = try broker.post("/v1/webhook-subscriptions", json: body, key: admin).status
            #expect(status == (described ? 201 : 400), "\(sample): described \(described), served \(status)")
        }
    }
}
