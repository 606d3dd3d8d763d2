import BrokerCore
import Console
import Foundation
import HTTPClient
import PostgresClient
import TestSupport
import Testing

/// Least privilege between insiders (issue 38): keys only with the scopes the operator's roles
/// cover, receivers' secrets out of sight, and every administrative act an audit row with its
/// actor, target and outcome.
@Suite("Console rights", .offPool)
struct ConsoleRightsTests {
    /// `POST /api-keys` as the operator of `cookie`, from the keys page's own form.
    private func createKey(
        _ broker: ConsoleBroker, _ cookie: String, scopes: String, clientIDs: String = "", name: String = "backend"
    ) throws -> HTTPClientResponse {
        let page = try broker.get("/api-keys", cookie: cookie)
        #expect(page.status == 200)
        let csrf = try #require(ConsoleBroker.csrfToken(page))
        return try broker.post(
            "/api-keys", form: [("csrf_token", csrf), ("name", name), ("scopes", scopes), ("client_ids", clientIDs)],
            cookie: cookie)
    }

    private func keys(_ broker: ConsoleBroker) throws -> [(scopes: String, clientIDs: String?)] {
        try broker.pool.query("SELECT scopes, array_to_string(client_ids, ',') AS client_ids FROM api_keys ORDER BY created_at")
            .map { (try $0.decode(String.self, "scopes"), try $0.decode(String?.self, "client_ids")) }
    }

    @Test(
        "the console creates a key only with scopes its operator's roles cover (read, compliance, login: compliance; admin, events: admin), optionally for some client ids; the rest is 403 with no key written"
    )
    func keyScopesFollowRoles() throws {
        let broker = try ConsoleBroker()
        let admin = try broker.signIn(.admin, operator: "ada")
        for scopes in ["read", "compliance", "login", "events,read", "admin,compliance"] {
            let refused = try createKey(broker, admin, scopes: scopes)
            #expect(refused.status == 403, "admin, \(scopes)")
            #expect(refused.header("X-Console-Refusal") == "console_forbidden")
            #expect(refused.bodyText.contains("needs the compliance role"), "\(scopes)")
        }
        #expect(try keys(broker).isEmpty, "nothing written")
        #expect(
            try broker.count(
                "SELECT count(*) FROM audit_log WHERE action = 'api_key.created' AND outcome = 'refused' AND actor = 'console:ada'"
            )
                == 5)
        let events = try createKey(broker, admin, scopes: "events,admin")
        #expect(events.status == 201)

        let compliance = try broker.signIn(.compliance, operator: "dora")
        #expect(try broker.get("/api-keys", cookie: compliance).bodyText.contains("your roles allow: login, read, compliance"))
        let limited = try createKey(broker, compliance, scopes: "read,compliance,login", clientIDs: ConsoleBroker.clientID)
        #expect(limited.status == 201, "\(limited.bodyText)")
        for scopes in ["admin", "events", "read,events"] {
            let refused = try createKey(broker, compliance, scopes: scopes)
            #expect(refused.status == 403, "compliance, \(scopes)")
            #expect(refused.bodyText.contains("needs the admin role"), "\(scopes)")
        }
        let unknown = try createKey(broker, compliance, scopes: "read", clientIDs: "com.other.app")
        #expect(unknown.status == 400)
        #expect(
            try keys(broker).map { "\($0.scopes)|\($0.clientIDs ?? "*")" } == [
                "admin,events|*", "compliance,login,read|\(ConsoleBroker.clientID)",
            ])
        // The key the compliance officer made reaches only its app.
        let secret = try #require(
            limited.bodyText.range(of: "<code class=\"code\">").map {
                String(limited.bodyText[$0.upperBound...].prefix { $0 != "<" })
            })
        let created = try #require(try APIKeyStore(pool: broker.pool).list().first { $0.scopes.contains(.read) })
        #expect(created.clientIDs == [ConsoleBroker.clientID] && secret.hasPrefix("abk_\(created.id)_"))

        // An operator revokes keys but creates none.
        let operatorCookie = try broker.signIn(.operator, operator: "otto")
        let page = try broker.get("/api-keys", cookie: operatorCookie)
        #expect(page.status == 200 && !page.bodyText.contains("action=\"/api-keys\""))
        let csrf = try #require(ConsoleBroker.csrfToken(page))
        #expect(
            try broker.post(
                "/api-keys", form: [("csrf_token", csrf), ("name", "x"), ("scopes", "read")], cookie: operatorCookie
            ).status == 403)
        #expect(try keys(broker).count == 2)
    }

    @Test("a webhook receiver's query and user-info are masked for every role but admin; audit rows hold no secret")
    func receiverSecretsMasked() throws {
        let broker = try ConsoleBroker()
        let adminKey = try APIKeyStore(pool: broker.pool).create(name: "ops", scopes: [.admin])
        let url = "https://hooks.example.com/in/app?token=s3cretvalue&x=1"
        let created = try broker.client.send(
            .init(
                method: "POST", url: broker.apiURL + "/v1/webhook-subscriptions",
                headers: [("Content-Type", "application/json"), ("Authorization", "Bearer \(adminKey.secret)")],
                body: Array(#"{"url":"\#(url)","topics":["*"]}"#.utf8)))
        #expect(created.status == 201)
        let signing = try #require(
            (try JSONSerialization.jsonObject(with: Data(created.body)) as? [String: Any])?["secret"] as? String)
        for role in ConsoleRole.allCases {
            let page = try broker.get("/webhooks", cookie: try broker.signIn(role, operator: "\(role)-1")).bodyText
            if role == .admin {
                #expect(page.contains("token=s3cretvalue"), "admin sees the whole URL")
            } else {
                #expect(!page.contains("s3cretvalue"), "\(role)")
                #expect(page.contains("https://hooks.example.com/in/app?•••"), "\(role)")
            }
        }
        let audit = try broker.pool.query("SELECT concat_ws(' ', actor, action, target, subject, detail::text) FROM audit_log")
            .map { try $0.decode(String.self, 0) }
        #expect(!audit.isEmpty)
        for secret in ["s3cretvalue", signing, adminKey.secret, String(signing.dropFirst("whsec_".count))] {
            #expect(!audit.contains { $0.contains(secret) }, "a secret in the audit log")
        }
    }

    @Test(
        "every administrative act is an audit row with actor, target and outcome: keys, subscriptions, re-drives, sign-ins, failed ones too"
    )
    func everyActAudited() throws {
        let broker = try ConsoleBroker()
        let admin = try broker.signIn(.admin, operator: "ada")
        let key = try createKey(broker, admin, scopes: "admin")
        #expect(key.status == 201)
        let keyID = try #require(try APIKeyStore(pool: broker.pool).list().first?.id)
        var csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/webhooks", cookie: admin)))
        #expect(
            try broker.post(
                "/webhooks", form: [("csrf_token", csrf), ("url", "https://hooks.example.com/in"), ("topics", "*")], cookie: admin
            ).status == 201)
        let subscription = try broker.pool.query("SELECT id FROM webhook_subscriptions").single().decode(UUID.self, 0)
            .lowercasedString
        let operatorCookie = try broker.signIn(.operator, operator: "otto")
        csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/webhooks", cookie: operatorCookie)))
        #expect(
            try broker.post("/webhooks/\(subscription)/pause", form: [("csrf_token", csrf)], cookie: operatorCookie).status
                == 303)
        _ = try broker.signInUser()  // user.created: a delivery for the subscription
        let delivery = try broker.pool.query("UPDATE webhook_deliveries SET state = 'failed' RETURNING id").single().decode(
            Int64.self, 0)
        for _ in 0..<2 {
            _ = try broker.post("/webhooks/deliveries/\(delivery)/retry", form: [("csrf_token", csrf)], cookie: operatorCookie)
        }
        #expect(
            try broker.post("/api-keys/\(keyID)/revoke", form: [("csrf_token", csrf)], cookie: operatorCookie).status == 303)
        _ = try broker.post("/link", form: [("token", "not-a-link")])
        // A deletion through the API: written by the released SQL function, which names neither
        // target nor outcome; and a row as the previous release writes a key's revocation.
        let compliance = try APIKeyStore(pool: broker.pool).create(name: "dpo", scopes: [.compliance])
        let user = try broker.signInUser()
        let requested = try broker.client.send(
            .init(
                method: "POST", url: broker.apiURL + "/v1/deletions",
                headers: [("Content-Type", "application/json"), ("Authorization", "Bearer \(compliance.secret)")],
                body: Array(#"{"user_id":"\#(user.id.lowercasedString)","reason":"asked","requested_by":"dpo"}"#.utf8)))
        #expect(requested.status == 202)
        let deletionID = try broker.pool.query("SELECT id FROM deletion_requests").single().decode(UUID.self, 0)
        try broker.pool.query(
            "INSERT INTO audit_log (actor, action, detail) VALUES ('cli', 'api_key.revoked', '{\"key_id\":\"oldrelease1\"}')")
        // Rows that carry their target and outcome words in `detail`, as the OpenID Provider writes them.
        try broker.pool.query(
            """
            INSERT INTO audit_log (actor, action, detail) VALUES
              ('api:k1', 'oidc_client.created', '{"target":"rp-1","outcome":"created"}'),
              ('api:k2', 'oidc_client.deleted', '{"target":"rp-2","outcome":"refused_client_not_allowed"}')
            """)

        let rows = try broker.pool.query(
            "SELECT actor, action, target, outcome FROM audit_log WHERE actor <> 'test' ORDER BY id"
        ).map {
            "\(try $0.decode(String.self, "actor")) \(try $0.decode(String.self, "action")) \(try $0.decode(String?.self, "target") ?? "-") \(try $0.decode(String?.self, "outcome") ?? "-")"
        }
        for expected in [
            "console:ada console.link_redeemed console_session succeeded",
            "console:ada api_key.created api_key:\(keyID) succeeded",
            "console:ada webhook_subscription.created webhook_subscription:\(subscription) succeeded",
            "console:otto webhook_subscription.paused webhook_subscription:\(subscription) succeeded",
            "console:otto webhook_delivery.retried webhook_delivery:\(delivery) succeeded",
            "console:otto webhook_delivery.retried webhook_delivery:\(delivery) failed",
            "console:otto api_key.revoked api_key:\(keyID) succeeded",
            "anonymous console.sign_in_refused console_session refused",
            "api:dpo deletion.requested deletion:\(deletionID.lowercasedString) succeeded",
            "cli api_key.revoked api_key:oldrelease1 succeeded",
            "api:k1 oidc_client.created oidc_client:rp-1 succeeded",
            "api:k2 oidc_client.deleted oidc_client:rp-2 refused",
        ] {
            #expect(rows.contains(expected), "\(expected) not in \(rows)")
        }
        #expect(rows.allSatisfy { !$0.hasSuffix(" -") }, "a row without outcome: \(rows)")
    }
}
