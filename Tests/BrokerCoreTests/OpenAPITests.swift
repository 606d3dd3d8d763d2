import AppleID
import BrokerAPI
import BrokerCore
import Foundation
import HTTPClient
import TestSupport
import Testing

@Suite("OpenAPI description", .offPool)
struct OpenAPITests {
    @Test("every route the router knows is described, and every described operation is a route")
    func routesMatch() throws {
        // Every route: the API's, Apple's notification endpoint and the OpenID Provider's
        // (an issuer without a path, as the description's paths are written).
        let broker = try TestBroker(
            roles: [.api, .notifications],
            extra: [
                "BROKER_PUBLIC_URL": "https://broker.example.com", "OIDC_ISSUER": "https://id.example.com",
                "OIDC_APPLE_CLIENT_ID": TestBroker.webClientID,
            ])
        let response = try broker.get("/openapi.json")
        #expect(response.status == 200)
        let document = try #require(try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any])
        #expect(document["openapi"] as? String == "3.1.0")
        let paths = try #require(document["paths"] as? [String: [String: Any]])
        var described = Set<String>()
        for (path, operations) in paths {
            for method in operations.keys where ["get", "post", "put", "patch", "delete", "options"].contains(method) {
                described.insert("\(method.uppercased()) \(path)")
            }
        }
        let served = Set(broker.application.routes)
        #expect(served.subtracting(described).isEmpty, "undescribed routes: \(served.subtracting(described).sorted())")
        #expect(described.subtracting(served).isEmpty, "described but not served: \(described.subtracting(served).sorted())")
    }

    @Test("the problem codes the description lists are the catalog's, and each is explained")
    func problemCodes() throws {
        let description = try Repository.text("docs/openapi.json")
        let document = try #require(try JSONSerialization.jsonObject(with: Data(description.utf8)) as? [String: Any])
        let schemas = try #require((document["components"] as? [String: Any])?["schemas"] as? [String: Any])
        let code = try #require(
            ((schemas["Problem"] as? [String: Any])?["properties"] as? [String: Any])?["code"] as? [String: Any])
        let listed = Set(try #require(code["x-problem-codes"] as? [String]))
        let catalog = ProblemCatalog.documentedCodes
        #expect(catalog.count > 40)
        #expect(
            catalog.subtracting(listed).isEmpty,
            "codes the broker answers with, not listed: \(catalog.subtracting(listed).sorted())")
        #expect(
            listed.subtracting(catalog).isEmpty,
            "listed codes the broker never answers with: \(listed.subtracting(catalog).sorted())")
        // Listed is not enough: each is explained where an operation can answer with it.
        let text = description.replacingOccurrences(of: "\"x-problem-codes\"", with: "")
        let explained = catalog.filter { text.components(separatedBy: "`\($0)`").count > 1 }
        #expect(explained == catalog, "codes never explained in a response: \(catalog.subtracting(explained).sorted())")
    }

    @Test("the webhook URL pattern in the description is the rule the server applies")
    func webhookURLPattern() throws {
        let broker = try TestBroker()
        let admin = try broker.key([.admin])
        let document = try #require(
            try JSONSerialization.jsonObject(with: Data(broker.get("/openapi.json").body)) as? [String: Any])
        let schemas = try #require((document["components"] as? [String: Any])?["schemas"] as? [String: Any])
        let url = try #require(
            ((schemas["SubscriptionRequest"] as? [String: Any])?["properties"] as? [String: Any])?["url"] as? [String: Any])
        let pattern = try NSRegularExpression(pattern: try #require(url["pattern"] as? String))
        let samples = [
            "https://hooks.example.com/appleid?team=a&x=%20", "https://0", "http://localhost:6/_ys/a*", "http://[::1]:8080/h",
            "http://127.0.0.1/", "http://example.com/hook", "https://user:pw@example.com/", "https://example.com/#frag",
            "https://example.com/a b", "https://example.com/%zz", "ftp://example.com/", "https://-bad.example/",
        ]
        for sample in samples {
            let described = pattern.firstMatch(in: sample, range: NSRange(sample.startIndex..., in: sample)) != nil
            let body = String(
                decoding: try JSONSerialization.data(withJSONObject: ["url": sample, "topics": ["*"]]), as: UTF8.self)
            let status = try broker.post("/v1/webhook-subscriptions", json: body, key: admin).status
            #expect(status == (described ? 201 : 400), "\(sample): described \(described), served \(status)")
        }
    }
}
