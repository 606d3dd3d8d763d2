import AppleSimulator
import BrokerAPI
import BrokerCore
import Foundation
import HTTPClient
import PostgresClient
import StrictJSON
import TestSupport
import Testing

/// API keys limited to some apps (`api-keys create --client-ids`): a team with two apps gives
/// each backend a key that reaches its own app's users and nothing else.
extension TestBroker {
    /// `POST /v1/deletions` for `user` with `key`.
    fileprivate func requestDeletion(_ user: UUID, _ key: String) throws -> HTTPClientResponse {
        try post("/v1/deletions", json: #"{"user_id":"\#(user.lowercasedString)","reason":"asked","requested_by":"t"}"#, key: key)
    }
}

@Suite("API keys limited to apps", .offPool)
struct LimitedKeyTests {
    @Test("a key limited to one app logs in only its tokens and sees only its users, deletions, events and subscriptions")
    func isolation() throws {
        // Two apps in separate groups: com.example.app and com.example.web do not share users here.
        let broker = try TestBroker(
            roles: [.api, .deletion, .dispatch],
            extra: [
                "APPLE_APP_GROUPS": "\(TestBroker.clientID);\(TestBroker.webClientID)",
                "BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1",
                "BROKER_DISPATCH_INTERVAL_MS": "50",
            ])
        let store = APIKeyStore(pool: broker.pool)
        let all: Set<Scope> = [.login, .read, .compliance, .events, .admin]
        let limited = try store.create(name: "app-backend", scopes: all, clientIDs: [TestBroker.clientID]).secret
        let unlimited = try broker.key(all)
        let (appUser, _) = try broker.signIn(clients: [TestBroker.clientID])
        let (webUser, _) = try broker.signIn(clients: [TestBroker.webClientID])

        // Logins: a token for the other app is refused before its code is exchanged.
        let exchanges = broker.simulator.statistics.token
        let web = try broker.mint {
            $0.clientID = TestBroker.webClientID
            $0.withCode = true
        }
        let refused = try broker.login(["identity_token": web.idToken, "authorization_code": web.code!], key: limited)
        #expect(refused.status == 403)
        #expect(refused.json["code"] as? String == "client_not_allowed")
        #expect(broker.simulator.statistics.token == exchanges, "the code was not exchanged")
        #expect(try broker.login(["identity_token": try broker.mint().idToken], key: limited).status == 200)

        // Users and credential state: the other app's user does not exist for this key.
        #expect(try broker.get("/v1/users/\(appUser.lowercasedString)", key: limited).status == 200)
        let hidden = try broker.get("/v1/users/\(webUser.lowercasedString)", key: limited)
        #expect(hidden.status == 404)
        #expect(hidden.json["code"] as? String == "user_not_found")
        #expect(try broker.get("/v1/users/\(webUser.lowercasedString)/credential-state", key: limited).status == 404)
        #expect(
            try broker.get("/v1/users/\(webUser.lowercasedString)", key: unlimited).status == 200,
            "unlimited keys keep their reach")

        // Subscriptions: a limited key's own only, receiving only its app's events.
        func subscribe(_ key: String) throws -> String {
            let response = try broker.post(
                "/v1/webhook-subscriptions", json: #"{"url":"https://hooks.example.com/in","topics":["*"]}"#, key: key)
            #expect(response.status == 201)
            return try #require(response.json["id"] as? String)
        }
        let own = try subscribe(limited)
        let other = try subscribe(unlimited)
        let listed = try #require(
            try broker.get("/v1/webhook-subscriptions", key: limited).json["subscriptions"] as? [[String: Any]])
        #expect(listed.compactMap { $0["id"] as? String } == [own])
        #expect(try broker.get("/v1/webhook-subscriptions/\(other)", key: limited).status == 404)
        #expect(try broker.post("/v1/webhook-subscriptions/\(other)/pause", json: "{}", key: limited).status == 404)
        #expect(try broker.get("/v1/webhook-subscriptions/\(other)", key: unlimited).status == 200)
        try broker.pool.query("UPDATE webhook_subscriptions SET status = 'paused'")  // nothing goes out; rows are what count
        _ = try broker.signIn(clients: [TestBroker.webClientID])
        _ = try broker.signIn(clients: [TestBroker.clientID])
        let ownUsers = Set(
            try broker.pool.query(
                "SELECT DISTINCT e.user_id::text FROM webhook_deliveries d JOIN outbox_events e ON e.id = d.event_id WHERE d.subscription_id = \(own)::uuid"
            ).map { try $0.decode(String.self, 0) })
        let otherUsers = Set(
            try broker.pool.query(
                "SELECT DISTINCT e.user_id::text FROM webhook_deliveries d JOIN outbox_events e ON e.id = d.event_id WHERE d.subscription_id = \(other)::uuid"
            ).map { try $0.decode(String.self, 0) })
        #expect(otherUsers.count == 2)
        #expect(ownUsers.count == 1)
        #expect(
            ownUsers.isSubset(
                of: Set(
                    try broker.pool.query(
                        "SELECT user_id::text FROM apple_identities WHERE client_id = \(TestBroker.clientID)"
                    ).map { try $0.decode(String.self, 0) })))

        // Deletions: the other app's user cannot be deleted with this key; its own can, and the
        // record and user.deleted stay visible to it after the purge.
        #expect(try broker.requestDeletion(webUser, limited).status == 404)
        let accepted = try broker.requestDeletion(appUser, limited)
        #expect(accepted.status == 202)
        let deletionID = try #require(accepted.json["deletion_id"] as? String)
        #expect(try broker.requestDeletion(webUser, unlimited).status == 202)
        try waitUntil(seconds: 30) { try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 2 }
        #expect(try broker.get("/v1/deletions/\(deletionID)", key: limited).json["state"] as? String == "done")
        let deletions = try #require(try broker.get("/v1/deletions", key: limited).json["deletions"] as? [[String: Any]])
        #expect(deletions.compactMap { $0["deletion_id"] as? String } == [deletionID])
        #expect(try broker.get("/v1/users/\(appUser.lowercasedString)", key: limited).status == 410)
        #expect(try broker.get("/v1/users/\(webUser.lowercasedString)", key: limited).status == 404)

        // The feed: only the app's users' events, user.deleted of the purged one included. The
        // feed publishes only behind the cluster's oldest open transaction (a cursor must never
        // skip one), so with other tests' transactions open it may lag the purge: wait for it.
        var events: [[String: Any]] = []
        try waitUntil(seconds: 30) {
            events = try broker.get("/v1/events?limit=1000", key: limited).json["events"] as? [[String: Any]] ?? []
            return events.contains { $0["type"] as? String == "user.deleted" }
        }
        let everything = try #require(try broker.get("/v1/events?limit=1000", key: unlimited).json["events"] as? [[String: Any]])
        #expect(events.count < everything.count)
        #expect(!events.contains { $0["user_id"] as? String == webUser.lowercasedString })
        #expect(
            events.contains { $0["type"] as? String == "user.deleted" && $0["user_id"] as? String == appUser.lowercasedString })
    }

    @Test(
        "with the default app grouping a limited key reaches exactly its client ids, and a shared user's grants and account stay the other app's too"
    )
    func exactReachAndSharedUsers() throws {
        // Both apps one group (com.example.app its primary, the tests' default APPLE_APP_GROUPS),
        // which widened a key limited to com.example.web to both apps.
        let broker = try TestBroker(roles: [.api, .dispatch], extra: ["BROKER_DISPATCH_INTERVAL_MS": "50"])
        let store = APIKeyStore(pool: broker.pool)
        let all: Set<Scope> = [.login, .read, .compliance, .events]
        let web = try store.create(name: "web-backend", scopes: all, clientIDs: [TestBroker.webClientID]).secret
        let unlimited = try broker.key(all)
        let (appOnly, _) = try broker.signIn(clients: [TestBroker.clientID])
        let (webOnly, _) = try broker.signIn(clients: [TestBroker.webClientID])
        let (shared, _) = try broker.signIn(clients: [TestBroker.clientID, TestBroker.webClientID])
        // Apple's verdicts on the group's grant (a notification or the sweep): one grant, both
        // apps', named by the group's primary App ID (com.example.app); a sign-in writes it too
        // (its authorization timeline, issue 35).
        try broker.pool.query(
            """
            INSERT INTO apple_grants (identity_id, user_id, app_id, consent, email_forwarding)
            SELECT id, user_id, \(TestBroker.clientID), 'active', 'enabled' FROM apple_identities
            WHERE user_id IN (\(shared), \(webOnly))
            ON CONFLICT (identity_id, app_id) DO NOTHING
            """)
        // A key limited to the primary: the grant row of a user of the other app is no reach.
        let app = try store.create(name: "app-backend", scopes: all.union([.admin]), clientIDs: [TestBroker.clientID])
            .secret
        #expect(try broker.get("/v1/users/\(webOnly.lowercasedString)", key: app).status == 404)
        // Its webhook subscription (paused: rows are what count) gets no event of that user.
        let subscribed = try broker.post(
            "/v1/webhook-subscriptions", json: #"{"url":"https://hooks.example.com/in","topics":["*"]}"#, key: app)
        #expect(subscribed.status == 201)
        let subscription = try #require(subscribed.json["id"] as? String)
        try broker.pool.query("UPDATE webhook_subscriptions SET status = 'paused'")

        // Logins: a token of the other app is refused.
        let appToken = try broker.mint { $0.clientID = TestBroker.clientID }
        let refused = try broker.login(["identity_token": appToken.idToken], key: web)
        #expect(refused.status == 403)
        #expect(refused.json["code"] as? String == "client_not_allowed")

        // Reading: the other app's user does not exist for this key; the shared one does, with
        // the grant of its group (com.example.web's own) and no other.
        #expect(try broker.get("/v1/users/\(appOnly.lowercasedString)", key: web).status == 404)
        #expect(try broker.get("/v1/users/\(appOnly.lowercasedString)/credential-state", key: web).status == 404)
        #expect(try broker.get("/v1/users/\(webOnly.lowercasedString)", key: web).status == 200)
        let user = try broker.get("/v1/users/\(shared.lowercasedString)", key: web)
        #expect(user.status == 200)
        let identities = try #require(user.json["identities"] as? [[String: Any]])
        let apps = try #require(identities.first?["apps"] as? [[String: Any]])
        #expect(apps.compactMap { $0["client_id"] as? String } == [TestBroker.clientID], "the group's one grant")
        let state = try broker.get(
            "/v1/users/\(shared.lowercasedString)/credential-state?client_id=\(TestBroker.clientID)", key: web)
        #expect(state.status == 403, "another app's client id")
        #expect(state.json["code"] as? String == "client_not_allowed")
        #expect(
            try broker.get(
                "/v1/users/\(shared.lowercasedString)/credential-state?client_id=\(TestBroker.webClientID)", key: web
            ).json["state"] as? String == "authorized")

        // Deleting: not another app's user (404), not a user other apps share (403, nothing
        // opened), its own user yes; an unlimited key deletes the shared one.
        #expect(try broker.requestDeletion(appOnly, web).status == 404)
        let sharedRefused = try broker.requestDeletion(shared, web)
        #expect(sharedRefused.status == 403)
        #expect(sharedRefused.json["code"] as? String == "user_shared_with_other_apps")
        #expect(sharedRefused.header("content-type") == "application/problem+json")
        #expect(try broker.count("SELECT count(*) FROM deletion_requests WHERE user_id = \(shared)") == 0)
        #expect(try broker.requestDeletion(webOnly, web).status == 202)
        #expect(try broker.requestDeletion(shared, unlimited).status == 202)
        #expect(
            (try broker.get("/v1/deletions", key: web).json["deletions"] as? [Any])?.count == 2,
            "its own user's deletion and the shared user's")

        // A deletion remembers exactly the apps its user was in: the other app's deleted user
        // stays out of the primary's key's reach.
        #expect(try broker.get("/v1/users/\(webOnly.lowercasedString)", key: app).status == 404)
        #expect(
            (try broker.get("/v1/deletions", key: app).json["deletions"] as? [Any])?.count == 1, "the shared user's only")

        let delivered = Set(
            try broker.pool.query(
                """
                SELECT DISTINCT e.user_id FROM webhook_deliveries d JOIN outbox_events e ON e.id = d.event_id
                WHERE d.subscription_id = \(subscription)::uuid
                """
            ).map { try $0.decode(UUID.self, 0) })
        #expect(delivered == [shared], "the shared user's deletion request, not the other app's user's")

        // The feed: nothing of the other app's user, either way.
        for (key, own, other) in [(web, webOnly, appOnly), (app, appOnly, webOnly)] {
            var events: [[String: Any]] = []
            try waitUntil(seconds: 30) {
                events = try broker.get("/v1/events?limit=1000", key: key).json["events"] as? [[String: Any]] ?? []
                return events.contains { $0["user_id"] as? String == own.lowercasedString }
            }
            #expect(!events.contains { $0["user_id"] as? String == other.lowercasedString })
        }
    }

    @Test(
        "a user who signed in to another app with an identity token only is shared; codes and grant events of that app stay out of a limited key's reach"
    )
    func signInsWithoutTokens() throws {
        // Two apps in separate groups (issue 38, item 8).
        let broker = try TestBroker(
            roles: [.api, .notifications],
            extra: ["APPLE_APP_GROUPS": "\(TestBroker.clientID);\(TestBroker.webClientID)"])
        let all: Set<Scope> = [.login, .read, .compliance, .events, .admin]
        let app = try APIKeyStore(pool: broker.pool).create(name: "app-backend", scopes: all, clientIDs: [TestBroker.clientID])
            .secret
        let unlimited = try broker.key(all)
        let subscribed = try broker.post(
            "/v1/webhook-subscriptions", json: #"{"url":"https://hooks.example.com/in","topics":["*"]}"#, key: app)
        #expect(subscribed.status == 201)
        let subscription = try #require(subscribed.json["id"] as? String)
        try broker.pool.query("UPDATE webhook_subscriptions SET status = 'paused'")  // rows are what count

        // The user signs in to the web app with an identity token only (no code: no token), then
        // to the app with a code: the identity's client id is the app's now, the only token too.
        let web = try broker.mint {
            $0.clientID = TestBroker.webClientID
            $0.withCode = false
        }
        let first = try broker.login(["identity_token": web.idToken])
        #expect(first.status == 200)
        let sharedID = try #require(first.json["user_id"] as? String)
        let shared = try #require(UUID(uuidString: sharedID))
        let later = try broker.mint {
            $0.clientID = TestBroker.clientID
            $0.withCode = true
            $0.sub = web.sub
        }
        #expect(try broker.login(["identity_token": later.idToken, "authorization_code": later.code!]).status == 200)
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE user_id = \(shared)") == 1)

        // Deleting the account would end it for the web app too: refused as for a token of it.
        let refused = try broker.requestDeletion(shared, app)
        #expect(refused.status == 403)
        #expect(refused.json["code"] as? String == "user_shared_with_other_apps")
        #expect(try broker.count("SELECT count(*) FROM deletion_requests WHERE user_id = \(shared)") == 0)

        // Also where no grant row says so: the previous release's sign-ins (broker_login, v0.24.0,
        // during a rolling upgrade) write none, so the web app's sign-in is known only from the
        // client ids the identity signed in with (apple_identity_apps).
        let webOnly = try broker.mint {
            $0.clientID = TestBroker.webClientID
            $0.withCode = false
        }
        let legacyLogin = try broker.login(["identity_token": webOnly.idToken])
        #expect(legacyLogin.status == 200)
        let legacy = try #require((legacyLogin.json["user_id"] as? String).flatMap(UUID.init(uuidString:)))
        let legacyApp = try broker.mint {
            $0.clientID = TestBroker.clientID
            $0.withCode = true
            $0.sub = webOnly.sub
        }
        #expect(try broker.login(["identity_token": legacyApp.idToken, "authorization_code": legacyApp.code!]).status == 200)
        try broker.pool.query("DELETE FROM apple_grants WHERE user_id = \(legacy) AND app_id = \(TestBroker.webClientID)")
        let legacyRefused = try broker.requestDeletion(legacy, app)
        #expect(legacyRefused.status == 403)
        #expect(legacyRefused.json["code"] as? String == "user_shared_with_other_apps")
        #expect(try broker.count("SELECT count(*) FROM deletion_requests WHERE user_id = \(legacy)") == 0)

        // The app's own user: a code of the web app handed over with its deletion never reaches Apple.
        let (own, ownSub) = try broker.signIn(clients: [TestBroker.clientID])
        let webCode = try broker.mint {
            $0.clientID = TestBroker.webClientID
            $0.withCode = true
            $0.sub = ownSub
        }
        let exchanges = broker.simulator.statistics.token
        let handed = try broker.post(
            "/v1/deletions",
            json:
                #"{"user_id":"\#(own.lowercasedString)","reason":"asked","requested_by":"t","authorization_code":"\#(webCode.code!)","client_id":"\#(TestBroker.webClientID)"}"#,
            key: app)
        #expect(handed.status == 403)
        #expect(handed.json["code"] as? String == "client_not_allowed")
        #expect(broker.simulator.statistics.token == exchanges, "the code was not sent to Apple")
        #expect(try broker.count("SELECT count(*) FROM deletion_requests WHERE user_id = \(own)") == 0)

        // Apple ends the web app's grant of the shared user: its consent.revoked is the web app's.
        let revoked = try broker.simulator.sendNotification(
            NotificationRequest(
                url: broker.baseURL + "/v1/apple/notifications", type: "consent-revoked", sub: web.sub,
                clientID: TestBroker.webClientID))
        #expect(revoked.status == 200)
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'consent.revoked'") == 1)
        // A later event of the app, so the feed has moved past the revocation when it shows it.
        let (marker, _) = try broker.signIn(clients: [TestBroker.clientID])
        for (key, sees) in [(app, false), (unlimited, true)] {
            var events: [[String: Any]] = []
            try waitUntil(seconds: 30) {
                events = try broker.get("/v1/events?limit=1000", key: key).json["events"] as? [[String: Any]] ?? []
                return events.contains { $0["user_id"] as? String == marker.lowercasedString }
            }
            #expect(events.contains { $0["type"] as? String == "consent.revoked" } == sees, "\(sees ? "unlimited" : "app") key")
        }
        let delivered = try broker.pool.query(
            """
            SELECT e.type FROM webhook_deliveries d JOIN outbox_events e ON e.id = d.event_id
            WHERE d.subscription_id = \(subscription)::uuid ORDER BY d.id
            """
        ).map { try $0.decode(String.self, 0) }
        #expect(!delivered.contains("consent.revoked"), "\(delivered)")
        #expect(delivered.contains("user.created"), "the app's own events are delivered: \(delivered)")
    }
}
