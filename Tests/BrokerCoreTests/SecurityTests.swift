import BrokerCore
import Foundation
import HTTPClient
import PostgresClient
import ProcessRunner
import TestSupport
import Testing

@Suite("Security posture")
struct SecurityTests {
    @Test("an API key over its rate gets 429 with Retry-After")
    func perKeyRateLimit() throws {
        let broker = try TestBroker(extra: ["BROKER_RATE_LIMIT_PER_KEY": "2"])
        let key = try broker.key([.read])
        let statuses = try (0..<8).map { _ in try broker.get("/v1/users/\(UUID().uuidString.lowercased())/credential-state", key: key) }
        #expect(statuses.prefix(4).allSatisfy { $0.status == 200 }, "the burst of twice the rate passes")
        let limited = try #require(statuses.last)
        #expect(limited.status == 429)
        #expect(limited.json["code"] as? String == "rate_limited")
        #expect(Int(limited.header("retry-after") ?? "") ?? 0 >= 1)
        // Another key has its own budget.
        #expect(try broker.get("/v1/users/\(UUID().uuidString.lowercased())/credential-state", key: broker.apiKey([.read])).status == 200)
    }

    @Test("the public notification endpoint limits each source address")
    func perAddressRateLimit() throws {
        let broker = try TestBroker(extra: ["BROKER_RATE_LIMIT_NOTIFICATIONS_PER_IP": "1"])
        let statuses = try (0..<8).map { _ in try broker.post("/v1/apple/notifications", json: #"{"payload":"x"}"#).status }
        #expect(statuses.prefix(5).allSatisfy { $0 == 401 }, "a burst of five reaches verification")
        #expect(statuses.last == 429)
    }

    @Test("with a certificate and key the listener speaks HTTPS")
    func tls() throws {
        let directory = NSTemporaryDirectory() + "abk-tls-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let made = try ChildProcess.run(
            "/usr/bin/openssl",
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", directory + "/key.pem", "-out", directory + "/cert.pem",
             "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"])
        #expect(made.status == 0, "\(made.output)")
        let broker = try TestBroker(extra: [
            "BROKER_TLS_CERT_PATH": directory + "/cert.pem", "BROKER_TLS_KEY_PATH": directory + "/key.pem",
        ])
        let client = CurlTransport(caCertificatesPath: directory + "/cert.pem")
        let response = try client.send(.init(url: "https://127.0.0.1:\(broker.application.port)/healthz"))
        #expect(response.status == 200)
        #expect(throws: HTTPClientError.self) { try CurlTransport().send(.init(url: "https://127.0.0.1:\(broker.application.port)/healthz")) }
    }

    @Test("operator actions are in the audit log, with ids and hosts but no secrets or URL paths")
    func audited() throws {
        let broker = try TestBroker()
        let store = APIKeyStore(pool: broker.pool)
        let (created, secret) = try store.create(name: "backend-eu", scopes: [.admin])
        let admin = "Bearer " + secret
        let body = #"{"url":"https://hooks.example.com/in/s3cr3t-path?token=abc","topics":["*"]}"#
        let subscription = try broker.post("/v1/webhook-subscriptions", json: body, key: secret)
        #expect(subscription.status == 201)
        let id = try #require(subscription.json["id"] as? String)
        for action in ["pause", "resume"] {
            #expect(try broker.client.send(.init(method: "POST", url: broker.baseURL + "/v1/webhook-subscriptions/\(id)/\(action)", headers: [("Authorization", admin)])).status == 200)
        }
        #expect(try broker.client.send(.init(method: "DELETE", url: broker.baseURL + "/v1/webhook-subscriptions/\(id)", headers: [("Authorization", admin)])).status == 204)
        #expect(try store.revoke(id: created.id))
        #expect(try store.revoke(id: created.id) == false, "a second revoke changes nothing and records nothing")

        let entries = try broker.pool.query("SELECT actor, action, detail::text FROM audit_log ORDER BY id").map {
            (try $0.decode(String.self, 0), try $0.decode(String.self, 1), try $0.decode(String.self, 2))
        }.filter { $0.1.hasPrefix("api_key.") || $0.1.hasPrefix("webhook_subscription.") }
        #expect(entries.map(\.1) == [
            "api_key.created", "webhook_subscription.created", "webhook_subscription.paused", "webhook_subscription.resumed",
            "webhook_subscription.deleted", "api_key.revoked",
        ])
        #expect(entries.filter { $0.1.hasPrefix("webhook_subscription.") }.allSatisfy { $0.0 == "api:\(created.id)" })
        #expect(entries[1].2.contains("hooks.example.com"))
        let everything = entries.map(\.2).joined()
        #expect(!everything.contains("s3cr3t") && !everything.contains("token=") && !everything.contains(secret))
    }
}
