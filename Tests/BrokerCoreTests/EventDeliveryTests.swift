import AppleSimulator
import BrokerAPI
import BrokerCore
import BrokerCrypto
import Foundation
import HTTPClient
import Locking
import PostgresClient
import ProcessRunner
import StrictJSON
import Synchronization
import TestSupport
import Testing

@testable import BrokerCore

/// Webhook delivery and the pull feed, with real receivers on loopback.
@Suite("Event delivery", .offPool)
struct EventDeliveryTests {
    static let fast = [
        "BROKER_DISPATCH_INTERVAL_MS": "50", "BROKER_WEBHOOK_RETRY_BASE_MS": "50", "BROKER_WEBHOOK_RETRY_MAX_SECONDS": "1",
        "BROKER_WEBHOOK_TIMEOUT_MS": "500",
    ]

    private func subscribe(_ broker: TestBroker, _ receiver: WebhookReceiver, topics: [String] = ["*"]) throws -> String {
        let body = try JSONSerialization.data(withJSONObject: ["url": receiver.url, "topics": topics])
        let response = try broker.post(
            "/v1/webhook-subscriptions", json: String(decoding: body, as: UTF8.self), key: broker.key([.admin]))
        #expect(response.status == 201, "\(response.bodyText)")
        let secret = try #require(response.json["secret"] as? String)
        #expect(secret.hasPrefix("whsec_"))
        receiver.setSecret(secret)
        return response.json["id"] as! String
    }

    /// Sends `count` alternating relay-mail notifications for a user, in event_time order.
    private func notifications(_ broker: TestBroker, sub: String, count: Int, base: Int64) throws {
        for index in 0..<count {
            var request = NotificationRequest(
                url: broker.baseURL + "/v1/apple/notifications", type: index % 2 == 0 ? "email-disabled" : "email-enabled",
                sub: sub, clientID: TestBroker.clientID)
            request.eventTimeMilliseconds = base + Int64(index)
            #expect(try broker.simulator.sendNotification(request).status == 200)
        }
    }

    @Test("every delivery is signed per Standard Webhooks; payloads carry the user id and no personal data")
    func signedDeliveries() throws {
        let broker = try TestBroker(roles: [.api, .notifications, .dispatch], extra: Self.fast)
        let receiver = try WebhookReceiver()
        _ = try subscribe(broker, receiver)
        let minted = try broker.mint()
        let userID = try broker.login(["identity_token": minted.idToken]).json["user_id"] as! String
        try notifications(broker, sub: minted.sub, count: 2, base: Int64(Date().timeIntervalSince1970 * 1000))
        waitUntil { receiver.deliveries.count >= 3 }
        let deliveries = receiver.deliveries
        #expect(deliveries.map(\.type) == ["user.created", "email.forwarding_disabled", "email.forwarding_enabled"])
        #expect(deliveries.allSatisfy { $0.signatureValid })
        #expect(deliveries.allSatisfy { $0.data["user_id"] == .string(userID) })
        #expect(!deliveries.contains { $0.data.values.contains { $0.stringValue?.contains("@") == true } })
        #expect(Set(deliveries.map(\.id)).count == 3)
        // Each body names its event as the pull feed does. The feed shows an event once no
        // older transaction of the cluster is in flight (its cursor must never skip one), so
        // with other tests' transactions open it may lag the dispatcher by a moment.
        let eventsKey = try broker.key([.events])
        var feed: [[String: Any]] = []
        waitUntil {
            feed = (try? broker.get("/v1/events", key: eventsKey).json["events"] as? [[String: Any]]) ?? []
            return feed.count >= 3
        }
        #expect(deliveries.map(\.eventID) == feed.compactMap { $0["id"] as? String }, "\(deliveries.map(\.eventID))")
    }

    @Test("a receiver down for a while, then failing with 500, a redirect and a stall, gets every event, in per-user order")
    func receiverOutage() throws {
        let broker = try TestBroker(roles: [.api, .notifications, .dispatch], extra: Self.fast)
        let receiver = try WebhookReceiver()
        _ = try subscribe(broker, receiver, topics: ["email.forwarding_disabled", "email.forwarding_enabled"])
        let subs = try (0..<4).map { _ -> String in
            let minted = try broker.mint()
            #expect(try broker.login(["identity_token": minted.idToken]).status == 200)
            return minted.sub
        }
        receiver.stop()
        let base = Int64(Date().timeIntervalSince1970 * 1000)
        for sub in subs { try notifications(broker, sub: sub, count: 6, base: base) }
        Thread.sleep(forTimeInterval: 0.5)
        try receiver.start()
        receiver.set(.status(500))
        Thread.sleep(forTimeInterval: 0.3)
        receiver.set(.redirect)
        Thread.sleep(forTimeInterval: 0.3)
        receiver.set(.stall(seconds: 1))
        Thread.sleep(forTimeInterval: 0.6)
        receiver.set(.accept)
        waitUntil(seconds: 30) { Set(receiver.deliveries.map(\.id)).count >= 24 }
        let deliveries = receiver.deliveries
        #expect(Set(deliveries.map(\.id)).count == 24, "none lost")
        #expect(deliveries.allSatisfy { $0.signatureValid })
        // Per user, the event times arrive in increasing order (first arrival of each id).
        var seen = Set<String>()
        var lastTime: [String: String] = [:]
        for delivery in deliveries where seen.insert(delivery.id).inserted {
            let user = delivery.data["user_id"]?.stringValue ?? ""
            let time = delivery.data["event_time"]?.stringValue ?? ""
            if let previous = lastTime[user] { #expect(previous < time, "in order for \(user)") }
            lastTime[user] = time
        }
        // The receiver holds a body before the dispatcher records its answer (seen under
        // ThreadSanitizer): wait for the last records, then assert.
        try waitUntil(seconds: 30) { try broker.count("SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'") >= 24 }
        #expect(try broker.count("SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'") == 24)
        #expect(try broker.count("SELECT count(*) FROM webhook_deliveries WHERE attempts > 1") > 0, "retries happened")
    }

    @Test("deliveries older than the maximum age fail, are listed, and can be re-driven; pause holds deliveries back")
    func deadLettersAndPause() throws {
        let broker = try TestBroker(
            roles: [.api, .dispatch], extra: Self.fast.merging(["BROKER_WEBHOOK_MAX_AGE_SECONDS": "1"]) { $1 })
        let receiver = try WebhookReceiver()
        let subscriptionID = try subscribe(broker, receiver)
        receiver.set(.status(500))
        _ = try broker.login(["identity_token": try broker.mint().idToken])
        try waitUntil { try broker.count("SELECT count(*) FROM webhook_deliveries WHERE state = 'failed'") == 1 }
        let admin = try broker.key([.admin])
        let failed = try broker.get("/v1/webhook-deliveries?state=failed", key: admin)
        let list = try #require(failed.json["deliveries"] as? [[String: Any]])
        #expect(list.count == 1)
        #expect(list.first?["last_status"] as? Int == 500)
        receiver.set(.accept)
        let id = list.first!["id"] as! Int
        #expect(try broker.post("/v1/webhook-deliveries/\(id)/retry", json: "{}", key: admin).status == 202)
        waitUntil { !receiver.deliveries.isEmpty }
        #expect(receiver.deliveries.count == 1)

        #expect(
            try broker.post("/v1/webhook-subscriptions/\(subscriptionID)/pause", json: "{}", key: admin).json["status"] as? String
                == "paused")
        _ = try broker.login(["identity_token": try broker.mint().idToken])
        Thread.sleep(forTimeInterval: 0.5)
        #expect(receiver.deliveries.count == 1, "nothing while paused")
        #expect(try broker.post("/v1/webhook-subscriptions/\(subscriptionID)/resume", json: "{}", key: admin).status == 200)
        waitUntil { receiver.deliveries.count == 2 }
        #expect(receiver.deliveries.count == 2)
        #expect(
            try broker.client.send(
                .init(
                    method: "DELETE", url: broker.baseURL + "/v1/webhook-subscriptions/\(subscriptionID)",
                    headers: [("Authorization", "Bearer \(admin)")])
            ).status == 204)
        #expect(try broker.get("/v1/webhook-subscriptions/\(subscriptionID)", key: admin).status == 404)
    }

    @Test("subscriptions refuse non-https URLs (plain http only on loopback) and unknown topics")
    func validation() throws {
        let broker = try TestBroker()
        let admin = try broker.key([.admin])
        func create(_ url: String, _ topics: [String] = ["*"]) throws -> String {
            let body = try JSONSerialization.data(withJSONObject: ["url": url, "topics": topics])
            let response = try broker.post("/v1/webhook-subscriptions", json: String(decoding: body, as: UTF8.self), key: admin)
            return "\(response.status) \(response.json["code"] as? String ?? "-")"
        }
        #expect(try create("http://example.com/hook") == "400 invalid_webhook_url")
        #expect(try create("ftp://example.com/hook") == "400 invalid_webhook_url")
        #expect(try create("not a url") == "400 invalid_webhook_url")
        #expect(try create("https://example.com/hook", ["user.exploded"]) == "400 invalid_topic")
        #expect(try create("https://example.com/hook") == "201 -")
        #expect(try create("http://127.0.0.1:9/hook", ["consent.revoked", "user.deleted"]) == "201 -")
        #expect(
            try broker.post(
                "/v1/webhook-subscriptions", json: #"{"url":"https://x.example","topics":["*"]}"#, key: broker.key([.login])
            ).status == 403)
        let list = try broker.get("/v1/webhook-subscriptions", key: admin)
        #expect((list.json["subscriptions"] as? [[String: Any]])?.count == 2)
        #expect(!list.bodyText.contains("whsec_"), "secrets are shown once, at creation")
    }

    @Test(
        "subscriptions are capped by BROKER_WEBHOOK_MAX_SUBSCRIPTIONS: 409 webhook_subscription_limit beyond, room again after a delete"
    )
    func subscriptionCap() throws {
        let broker = try TestBroker(roles: [.api], extra: ["BROKER_WEBHOOK_MAX_SUBSCRIPTIONS": "3"])
        let admin = try broker.key([.admin])
        let body = #"{"url":"https://example.com/hook","topics":["*"]}"#
        // Eight creators at once: exactly three get in.
        let statuses = try onThreads(8) { _ in try broker.post("/v1/webhook-subscriptions", json: body, key: admin).status }.map {
            try $0.get()
        }
        #expect(statuses.sorted() == [201, 201, 201, 409, 409, 409, 409, 409])
        let refused = try broker.post("/v1/webhook-subscriptions", json: body, key: admin)
        #expect(refused.status == 409)
        #expect(refused.json["code"] as? String == "webhook_subscription_limit")
        #expect(refused.headers.first { $0.0.lowercased() == "content-type" }?.1.hasPrefix("application/problem+json") == true)
        #expect(try broker.count("SELECT count(*) FROM webhook_subscriptions") == 3)
        let id = try broker.pool.query("SELECT id FROM webhook_subscriptions LIMIT 1").single().decode(UUID.self, 0)
        #expect(
            try broker.client.send(
                .init(
                    method: "DELETE", url: broker.baseURL + "/v1/webhook-subscriptions/\(id.lowercasedString)",
                    headers: [("Authorization", "Bearer \(admin)")])
            ).status == 204)
        #expect(try broker.post("/v1/webhook-subscriptions", json: body, key: admin).status == 201)
    }

    @Test(
        "each key holds at most BROKER_WEBHOOK_MAX_SUBSCRIPTIONS_PER_KEY subscriptions, all together BROKER_WEBHOOK_MAX_SUBSCRIPTIONS; the problem names the limit"
    )
    func subscriptionCapPerKey() throws {
        let broker = try TestBroker(
            roles: [.api],
            extra: ["BROKER_WEBHOOK_MAX_SUBSCRIPTIONS": "5", "BROKER_WEBHOOK_MAX_SUBSCRIPTIONS_PER_KEY": "2"])
        let store = APIKeyStore(pool: broker.pool)
        // A key limited to one app fills its own share, not every other app's.
        let limited = try store.create(name: "app", scopes: [.admin], clientIDs: [TestBroker.clientID]).secret
        let other = try store.create(name: "web", scopes: [.admin], clientIDs: [TestBroker.webClientID]).secret
        let unlimited = try store.create(name: "ops", scopes: [.admin]).secret
        let body = #"{"url":"https://example.com/hook","topics":["*"]}"#
        func create(_ key: String) throws -> HTTPClientResponse {
            try broker.post("/v1/webhook-subscriptions", json: body, key: key)
        }
        #expect(try create(limited).status == 201)
        #expect(try create(limited).status == 201)
        let own = try create(limited)
        #expect(own.status == 409)
        #expect(own.json["code"] as? String == "webhook_subscription_limit")
        #expect(own.json["limit"] as? String == "per_key")
        #expect(own.json["maximum"] as? String == "2")
        #expect((own.json["detail"] as? String)?.contains("BROKER_WEBHOOK_MAX_SUBSCRIPTIONS_PER_KEY") == true)
        #expect(try create(other).status == 201, "another app's key is not refused for the first one's")
        #expect(try create(unlimited).status == 201)
        #expect(try create(unlimited).status == 201)
        let total = try create(other)
        #expect(total.status == 409)
        #expect(total.json["limit"] as? String == "total")
        #expect(total.json["maximum"] as? String == "5")
        #expect((total.json["detail"] as? String)?.contains("BROKER_WEBHOOK_MAX_SUBSCRIPTIONS)") == true)
        #expect(try broker.count("SELECT count(*) FROM webhook_subscriptions") == 5)
        // The limited key still sees only its own two.
        let listed = try broker.get("/v1/webhook-subscriptions", key: limited).json["subscriptions"] as? [Any]
        #expect(listed?.count == 2)
    }

    @Test("a paused subscription's deliveries are parked out of the dispatcher's way; resume and the reconciler bring them back")
    func parkedWhilePaused() throws {
        let broker = try TestBroker(roles: [.api])
        let admin = try broker.key([.admin])
        let created = try broker.post(
            "/v1/webhook-subscriptions", json: #"{"url":"http://127.0.0.1:9/hook","topics":["*"]}"#, key: admin)
        let id = try #require(created.json["id"] as? String)
        func parked() throws -> Int {
            try broker.count("SELECT count(*) FROM webhook_deliveries WHERE state = 'pending' AND next_attempt_at = 'infinity'")
        }
        func emit(_ count: Int) throws {
            try broker.pool.query(
                "SELECT count(broker_emit_event('user.created', gen_random_uuid(), '{}')) FROM generate_series(1, \(count))")
        }
        try emit(3)
        #expect(try parked() == 0)
        #expect(try broker.post("/v1/webhook-subscriptions/\(id)/pause", json: "{}", key: admin).status == 200)
        #expect(try parked() == 3, "queued deliveries are parked")
        try emit(2)
        #expect(try parked() == 5, "so are those of events written while paused")
        #expect(try broker.post("/v1/webhook-subscriptions/\(id)/resume", json: "{}", key: admin).status == 200)
        #expect(try parked() == 0)
        #expect(try broker.count("SELECT count(*) FROM webhook_deliveries WHERE next_attempt_at <= now()") == 5)

        // What a resume racing an event's transaction leaves: a parked delivery of an active
        // subscription. And the other way round after a pause. The reconciler repairs both.
        try broker.pool.query(
            "UPDATE webhook_deliveries SET next_attempt_at = 'infinity' WHERE id = (SELECT min(id) FROM webhook_deliveries)")
        try WebhookSubscriptionStore.reconcileParkedDeliveries(broker.pool)
        #expect(try parked() == 0)
        try broker.pool.query("UPDATE webhook_subscriptions SET status = 'paused'")
        try WebhookSubscriptionStore.reconcileParkedDeliveries(broker.pool)
        #expect(try parked() == 5)
    }

    @Test("a dispatcher killed with SIGKILL mid-run loses nothing")
    func dispatcherCrash() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        let receiver = try WebhookReceiver()
        receiver.set(.stall(seconds: 0.02))
        _ = try subscribe(broker, receiver)
        for _ in 0..<120 { _ = try broker.login(["identity_token": try broker.mint().idToken]) }
        var environment = broker.environment
        environment.merge(Self.fast) { $1 }
        environment["BROKER_ROLES"] = "dispatch"
        environment["BROKER_DISPATCH_CONCURRENCY"] = "2"
        environment["BROKER_LISTEN"] = "127.0.0.1:0"
        let log = TestFiles.path("dispatch", suffix: ".log")
        for _ in 0..<2 {
            let dispatcher = try ChildProcess.start(
                BrokerExecutable.path, ["serve"], environment: environment, output: .file(log))
            let target = receiver.deliveries.count + 25
            waitUntil(seconds: 20) { receiver.deliveries.count >= target }
            dispatcher.send(SIGKILL)
            dispatcher.wait()
        }
        #expect(Set(receiver.deliveries.map(\.id)).count < 120, "killed mid-run")
        receiver.set(.accept)
        // The killed dispatchers' leases (60 s) would hold their last deliveries back; expire them.
        try broker.pool.query("UPDATE webhook_deliveries SET next_attempt_at = now() WHERE state = 'pending'")
        let finisher = try ChildProcess.start(BrokerExecutable.path, ["serve"], environment: environment, output: .file(log))
        defer {
            finisher.send(SIGTERM)
            finisher.wait()
        }
        waitUntil(seconds: 30) { Set(receiver.deliveries.map(\.id)).count >= 120 }
        #expect(Set(receiver.deliveries.map(\.id)).count == 120)
        // The receiver has the last body a moment before the dispatcher records its answer.
        try waitUntil(seconds: 10) {
            try broker.count("SELECT count(*) FROM webhook_deliveries WHERE state <> 'delivered'") == 0
        }
    }

    @Test("the pull feed orders by transaction id as a number: 9, 10, 100 — not as text")
    func feedOrdersTransactionsNumerically() throws {
        let broker = try TestBroker(roles: [.api])
        let events = try broker.key([.events])
        // Old transaction ids (below every snapshot's xmin), written out of numeric order so
        // neither id order nor text order ("10" < "100" < "9") matches the right one.
        for txid in [100, 10, 9] {
            try broker.pool.query(
                "INSERT INTO outbox_events (type, payload, txid) VALUES ('consent.revoked', jsonb_build_object('txid', \(txid)::int), \(String(txid))::xid8)"
            )
        }
        var cursor = ""
        var order: [Int] = []
        for _ in 0..<5 {
            let page = try broker.get("/v1/events?limit=1&after=\(cursor)", key: events)
            #expect(page.status == 200)
            let items = page.json["events"] as? [[String: Any]] ?? []
            order += items.compactMap { ($0["data"] as? [String: Any])?["txid"] as? Int }
            cursor = page.json["next_cursor"] as? String ?? cursor
        }
        #expect(order == [9, 10, 100])
    }

    @Test("the pull feed, read while 8 writers commit out of order, returns every event exactly once")
    func feedWithLateCommits() throws {
        let broker = try TestBroker(roles: [.api])
        let events = try broker.key([.events])
        let configuration = broker.application.database.connection
        let writers = 8
        let perWriter = 25
        let done = Lock<Int>(0)
        for writer in 0..<writers {
            Thread {
                let connection = try! PostgresConnection(configuration: configuration)
                for index in 0..<perWriter {
                    try! connection.execute("BEGIN")
                    // The transaction id is taken at the first write; committing after a pause
                    // puts later ids' commits before this one's. The pauses (0 to 30 ms) differ
                    // between writers and rounds by a fixed pattern, not by chance.
                    try! connection.query(
                        "SELECT broker_emit_event('consent.revoked', NULL, jsonb_build_object('writer', \(writer)::int, 'index', \(index)::int))"
                    )
                    Thread.sleep(forTimeInterval: Double((writer * 7 + index * 13) % 31) / 1000)
                    try! connection.execute("COMMIT")
                }
                done.withLock { $0 += 1 }
            }.start()
        }
        var cursor = ""
        var seen: [String] = []
        var pages: [String] = []
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            let page = try broker.get("/v1/events?limit=7&after=\(cursor)", key: events)
            #expect(page.status == 200)
            let items = page.json["events"] as? [[String: Any]] ?? []
            seen.append(contentsOf: items.compactMap { $0["id"] as? String })
            if !items.isEmpty {
                let rows = items.map { item in
                    let position = (item["cursor"] as? String).flatMap { Base64URL.decode($0) }.map {
                        String(decoding: $0, as: UTF8.self)
                    }
                    return "\(item["id"] as? String ?? "?")@\(position ?? "?")"
                }
                pages.append("\(cursor)->\(rows)")
            }
            cursor = page.json["next_cursor"] as? String ?? cursor
            if items.isEmpty {
                if done.withLock({ $0 }) == writers && seen.count >= writers * perWriter { break }
                Thread.sleep(forTimeInterval: 0.01)
            }
        }
        let twice = Dictionary(grouping: seen, by: { $0 }).filter { $0.value.count > 1 }.keys.sorted()
        #expect(Set(seen).count == seen.count, "no event twice: \(twice); pages: \(pages)")
        #expect(Set(seen).count == writers * perWriter, "pages: \(pages)")
        #expect(try broker.get("/v1/events?after=garbage", key: events).status == 400)
        #expect(try broker.get("/v1/events", key: broker.key([.read])).status == 403)
    }
}

@Suite("Event retention", .offPool)
struct EventRetentionTests {
    @Test("delivered events age out; failed and parked deliveries after the dead-letter retention; due ones never")
    func prune() throws {
        let broker = try TestBroker(roles: [.api])
        let pool = broker.pool
        try pool.query(
            """
            INSERT INTO webhook_subscriptions (id, url, topics, secret, key_id)
            VALUES (\(UUID()), 'https://example.com/hook', '["consent.revoked"]', '\\x00', 'k')
            """)
        // Three subscribed events (one delivery each) and one only the pull feed sees.
        for _ in 0..<3 { try pool.query("SELECT broker_emit_event('consent.revoked', NULL, '{}'::jsonb)") }
        try pool.query("SELECT broker_emit_event('user.created', NULL, '{}'::jsonb)")
        try pool.query("UPDATE outbox_events SET created_at = now() - interval '30 days'")
        let deliveries = try pool.query("SELECT id FROM webhook_deliveries ORDER BY id").map { try $0.decode(Int64.self, 0) }
        #expect(deliveries.count == 3)
        try pool.query(
            "UPDATE webhook_deliveries SET state = 'delivered', delivered_at = now() - interval '30 days' WHERE id = \(deliveries[0])"
        )
        try pool.query("UPDATE webhook_deliveries SET state = 'failed' WHERE id = \(deliveries[1])")
        // deliveries[2] stays pending.

        let pruned = try EventRetention.prune(pool, retention: .seconds(7 * 86_400), deadLetterRetention: .seconds(14 * 86_400))
        #expect(pruned.deliveries == 1, "the delivered one")
        #expect(pruned.events == 2, "its event and the feed-only one")
        #expect(try broker.count("SELECT count(*) FROM webhook_deliveries WHERE state IN ('pending', 'failed')") == 2)
        #expect(try broker.count("SELECT count(*) FROM outbox_events") == 2)
        let again = try EventRetention.prune(pool, retention: .seconds(7 * 86_400), deadLetterRetention: .seconds(14 * 86_400))
        #expect(again.deliveries == 0 && again.events == 0)

        // Older than the dead-letter retention: the failed one goes, and so does one parked
        // by a paused subscription; a due one stays, however old.
        try pool.query("UPDATE webhook_deliveries SET created_at = now() - interval '20 days'")
        let due = try broker.count("SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'")
        #expect(due == 1)
        try pool.query("SELECT broker_emit_event('consent.revoked', NULL, '{}'::jsonb)")
        try pool.query(
            """
            UPDATE webhook_deliveries SET next_attempt_at = 'infinity', created_at = now() - interval '20 days'
            WHERE id = (SELECT max(id) FROM webhook_deliveries)
            """)
        let aged = try EventRetention.prune(pool, retention: .seconds(7 * 86_400), deadLetterRetention: .seconds(14 * 86_400))
        #expect(aged.deliveries == 2, "the failed one and the parked one")
        #expect(try broker.count("SELECT count(*) FROM webhook_deliveries") == 1)
        #expect(
            try broker.count("SELECT count(*) FROM webhook_deliveries WHERE state = 'pending' AND next_attempt_at < 'infinity'")
                == 1)
    }
}
