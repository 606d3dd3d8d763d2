import AppleSimulator
import BrokerAPI
import Foundation
import Glibc
import HTTPClient
import PostgresClient
import ProcessRunner
import TestSupport
import Testing

@testable import BrokerCore

@Suite("Security posture", .offPool)
struct SecurityTests {
    @Test("an API key over its rate gets 429 with Retry-After")
    func perKeyRateLimit() throws {
        let broker = try TestBroker(extra: ["BROKER_RATE_LIMIT_PER_KEY": "2"])
        let key = try broker.key([.read])
        let statuses = try (0..<8).map { _ in
            try broker.get("/v1/users/\(UUID().uuidString.lowercased())/credential-state", key: key)
        }
        #expect(statuses.prefix(4).allSatisfy { $0.status == 200 }, "the burst of twice the rate passes")
        let limited = try #require(statuses.last)
        #expect(limited.status == 429)
        #expect(limited.json["code"] as? String == "rate_limited")
        #expect(Int(limited.header("retry-after") ?? "") ?? 0 >= 1)
        // Another key has its own budget.
        #expect(
            try broker.get("/v1/users/\(UUID().uuidString.lowercased())/credential-state", key: broker.apiKey([.read])).status
                == 200)
    }

    @Test("the public notification endpoint limits each source address's junk, never Apple's signed notifications")
    func perAddressRateLimit() throws {
        let broker = try TestBroker(roles: [.api, .notifications], extra: ["BROKER_RATE_LIMIT_NOTIFICATIONS_PER_IP": "1"])
        let statuses = try (0..<8).map { _ in try broker.post("/v1/apple/notifications", json: #"{"payload":"x"}"#).status }
        #expect(statuses.prefix(5).allSatisfy { $0 == 401 }, "a burst of five reaches verification")
        #expect(statuses.last == 429)
        // Apple posts from the same address (here loopback; in production often a proxy's).
        let signed = try broker.simulator.sendNotification(
            NotificationRequest(
                url: broker.baseURL + "/v1/apple/notifications", type: "consent-revoked", sub: "000123.unknown.0001",
                clientID: TestBroker.clientID))
        #expect(signed.status == 200, "a verified notification was refused for the junk's budget")
    }

    @Test("webhook URLs that reach loopback, private, link-local, CGNAT or numeric-form addresses are refused at subscription")
    func webhookSSRFAtSubscription() throws {
        let broker = try TestBroker(extra: ["BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS": "false"])
        let admin = try broker.key([.admin])
        func create(_ url: String) throws -> String {
            let body = try JSONSerialization.data(withJSONObject: ["url": url, "topics": ["*"]])
            let response = try broker.post("/v1/webhook-subscriptions", json: String(decoding: body, as: UTF8.self), key: admin)
            return "\(response.status) \(response.json["code"] as? String ?? "-")"
        }
        let refused = [
            "https://169.254.169.254/latest/meta-data/", "https://127.0.0.1:8443/", "http://localhost:9/", "https://10.1.2.3/",
            "https://192.168.0.10/", "https://100.64.0.1/", "https://0.0.0.0/", "https://2130706433/", "https://0x7f.0.0.1/",
            "https://127.1/", "https://0177.0.0.1/", "https://api.localhost/", "https://localhost./", "http://127.0.0.1:9/hook",
            "https://224.0.0.1/", "https://172.16.5.4/",
        ]
        for url in refused {
            #expect(try create(url) == "400 invalid_webhook_url", "\(url)")
        }
        #expect(try broker.count("SELECT count(*) FROM webhook_subscriptions") == 0)
        #expect(try create("https://hooks.example.com/in") == "201 -", "a name is resolved at delivery, not here")
        #expect(try create("https://8.8.8.8/in") == "201 -", "a public literal address is fine")

        // Address rules themselves, IPv6 included.
        for (text, expected) in [
            ("::1", false), ("fe80::1", false), ("fd00::5", false), ("::ffff:10.0.0.1", false), ("64:ff9b::a9fe:a9fe", false),
            ("ff02::1", false), ("2001:db8::1", false), ("2606:4700::1111", true), ("::ffff:8.8.8.8", true),
        ] {
            var address = in6_addr()
            #expect(inet_pton(AF_INET6, text, &address) == 1)
            #expect(OutboundAddress.isPublic(withUnsafeBytes(of: address) { Array($0) }) == expected, "\(text)")
        }
    }

    @Test("a webhook host name that resolves to a private address is not connected to; last_error names a category only")
    func webhookSSRFAtDelivery() throws {
        // This machine's own name resolves to loopback (/etc/hosts); without such a name there
        // is nothing to resolve privately on an offline machine.
        var buffer = [CChar](repeating: 0, count: 256)
        gethostname(&buffer, buffer.count)
        let hostname = String(decoding: buffer.prefix { $0 != 0 }.map(UInt8.init(bitPattern:)), as: UTF8.self)
        guard let resolved = try? OutboundAddress.resolve(hostname),
            resolved.contains(where: { !OutboundAddress.isPublic($0.bytes) })
        else {
            Issue.record("\(hostname) does not resolve to a private address here; the delivery-time check was not exercised")
            return
        }
        let broker = try TestBroker(
            roles: [.api, .dispatch],
            extra: [
                "BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS": "false", "BROKER_DISPATCH_INTERVAL_MS": "50",
                "BROKER_WEBHOOK_RETRY_BASE_MS": "50",
            ])
        let receiver = try WebhookReceiver()
        let admin = try broker.key([.admin])
        let body = try JSONSerialization.data(withJSONObject: [
            "url": "https://\(hostname):\(receiver.port)/hook", "topics": ["*"],
        ])
        #expect(
            try broker.post("/v1/webhook-subscriptions", json: String(decoding: body, as: UTF8.self), key: admin).status == 201)
        _ = try broker.login(["identity_token": try broker.mint().idToken])
        let deadline = Date().addingTimeInterval(10)
        while try broker.count("SELECT count(*) FROM webhook_deliveries WHERE attempts > 0 AND last_error IS NOT NULL") == 0,
            Date() < deadline
        {
            Thread.sleep(forTimeInterval: 0.05)
        }
        let row = try broker.pool.query("SELECT last_error, last_status FROM webhook_deliveries").single()
        #expect(try row.decode(String?.self, 0) == "address_not_allowed")
        #expect(try row.decode(Int?.self, 1) == nil)
        #expect(receiver.deliveries.isEmpty, "nothing reached the loopback receiver")
    }

    @Test(
        "a pinned address is used by that request only: a later request to the same host:port, unpinned or pinned elsewhere, does not reach it"
    )
    func noPinLeftBehind() throws {
        let receiver = try WebhookReceiver()
        let transport = CurlTransport(maximumIdleHandles: 1)  // one handle, so every request could reuse it
        let url = "http://pinned.invalid:\(receiver.port)/hook"
        var pinned = HTTPClientRequest(method: "POST", url: url, body: Array("{}".utf8), timeout: .seconds(2))
        pinned.pinnedAddresses = ["127.0.0.1"]
        #expect(try transport.send(pinned).status < 500, "the pin reaches the receiver")
        // Unpinned: pinned.invalid does not resolve, so this must fail, whatever the last request pinned.
        let unpinned = HTTPClientRequest(method: "POST", url: url, body: Array("{}".utf8), timeout: .seconds(2))
        #expect(throws: HTTPClientError.self) { try transport.send(unpinned) }
        // Pinned elsewhere (nothing listens there): no connection to the old address is reused.
        var elsewhere = pinned
        elsewhere.pinnedAddresses = ["127.0.0.2"]
        #expect(throws: HTTPClientError.self) { try transport.send(elsewhere) }
        // The same pin again still works (keep-alive is kept for an unchanged pin).
        #expect(try transport.send(pinned).status < 500)
    }

    @Test("resolving a webhook host gives up after BROKER_WEBHOOK_DNS_TIMEOUT_MS, and a stuck resolver does not pile up threads")
    func resolverTimeout() throws {
        let release = DispatchSemaphore(value: 0)
        var resolver = ReceiverResolver(timeout: .milliseconds(200)) { _ in
            release.wait()
            return ["192.0.2.1"]
        }
        resolver.maximumInFlight = 2
        let started = Date()
        #expect(throws: ReceiverResolver.Failure.timedOut) { try resolver.publicAddresses(of: "slow.example") }
        #expect(Date().timeIntervalSince(started) < 1.5)
        #expect(throws: ReceiverResolver.Failure.timedOut) { try resolver.publicAddresses(of: "slow.example") }
        // Two lookups still hang: a third fails at once instead of starting a thread.
        let third = Date()
        #expect(throws: ReceiverResolver.Failure.timedOut) { try resolver.publicAddresses(of: "slow.example") }
        #expect(Date().timeIntervalSince(third) < 0.1)
        release.signal()
        release.signal()
        let quick = ReceiverResolver(timeout: .seconds(2)) { _ in ["192.0.2.1"] }
        #expect(try quick.publicAddresses(of: "fast.example") == ["192.0.2.1"])
    }

    @Test("a webhook host that does not resolve is recorded as address_not_allowed, like a private one: no internal DNS oracle")
    func webhookUnresolvableIsNotAnOracle() throws {
        let broker = try TestBroker(
            roles: [.api, .dispatch],
            extra: [
                "BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS": "false", "BROKER_DISPATCH_INTERVAL_MS": "50",
                "BROKER_WEBHOOK_RETRY_BASE_MS": "50",
            ])
        let admin = try broker.key([.admin])
        let body = #"{"url":"https://no-such-host.invalid/hook","topics":["*"]}"#
        #expect(try broker.post("/v1/webhook-subscriptions", json: body, key: admin).status == 201)
        _ = try broker.login(["identity_token": try broker.mint().idToken])
        try waitUntil(seconds: 10) {
            try broker.count("SELECT count(*) FROM webhook_deliveries WHERE attempts > 0 AND last_error IS NOT NULL") > 0
        }
        let row = try broker.pool.query("SELECT last_error FROM webhook_deliveries").single()
        #expect(try row.decode(String?.self, 0) == "address_not_allowed")
    }

    @Test("with a certificate and key the listener speaks HTTPS")
    func tls() throws {
        let directory = TestFiles.path("tls")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let made = try ChildProcess.run(
            "/usr/bin/openssl",
            [
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", directory + "/key.pem", "-out",
                directory + "/cert.pem",
                "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            ])
        #expect(made.status == 0, "\(made.output)")
        let broker = try TestBroker(extra: [
            "BROKER_TLS_CERT_PATH": directory + "/cert.pem", "BROKER_TLS_KEY_PATH": directory + "/key.pem",
        ])
        let client = CurlTransport(caCertificatesPath: directory + "/cert.pem")
        let response = try client.send(.init(url: "https://127.0.0.1:\(broker.application.port)/healthz"))
        #expect(response.status == 200)
        // Terminating TLS itself, the broker tells browsers to stay on HTTPS, and limits
        // connections per address by default.
        #expect(response.header("strict-transport-security") == "max-age=31536000")
        #expect(response.header("x-content-type-options") == "nosniff")
        #expect(broker.application.configuration.connectionsPerAddress == 64)
        #expect(throws: HTTPClientError.self) {
            try CurlTransport().send(.init(url: "https://127.0.0.1:\(broker.application.port)/healthz"))
        }
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
            #expect(
                try broker.client.send(
                    .init(
                        method: "POST", url: broker.baseURL + "/v1/webhook-subscriptions/\(id)/\(action)",
                        headers: [("Authorization", admin)])
                ).status == 200)
        }
        #expect(
            try broker.client.send(
                .init(
                    method: "DELETE", url: broker.baseURL + "/v1/webhook-subscriptions/\(id)", headers: [("Authorization", admin)]
                )
            ).status == 204)
        #expect(try store.revoke(id: created.id))
        #expect(try store.revoke(id: created.id) == false, "a second revoke changes nothing and records nothing")

        let entries = try broker.pool.query("SELECT actor, action, detail::text FROM audit_log ORDER BY id").map {
            (try $0.decode(String.self, 0), try $0.decode(String.self, 1), try $0.decode(String.self, 2))
        }.filter { $0.1.hasPrefix("api_key.") || $0.1.hasPrefix("webhook_subscription.") }
        #expect(
            entries.map(\.1) == [
                "api_key.created", "webhook_subscription.created", "webhook_subscription.paused", "webhook_subscription.resumed",
                "webhook_subscription.deleted", "api_key.revoked",
            ])
        #expect(entries.filter { $0.1.hasPrefix("webhook_subscription.") }.allSatisfy { $0.0 == "api:\(created.id)" })
        #expect(entries[1].2.contains("hooks.example.com"))
        let everything = entries.map(\.2).joined()
        #expect(!everything.contains("s3cr3t") && !everything.contains("token=") && !everything.contains(secret))
    }
}
