import AppleSimulator
import BrokerCore
import Console
import Foundation
import HTTPClient
import PostgresClient
import TestSupport
import Testing

/// Follow-ups, the audited lookup and reveal, API keys and the audit export.
@Suite("Console follow-ups and operations", .offPool)
struct ConsoleFollowUpTests {
    private func waitForDone(_ broker: ConsoleBroker) throws {
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 1 { return }
            Thread.sleep(forTimeInterval: 0.1)
        }
        Issue.record("the deletion never completed")
    }

    @Test("a deletion with no token to revoke opens a TN3194 follow-up; a later consent-revoked for the same sub closes it")
    func manualRevocationFollowUp() throws {
        let broker = try ConsoleBroker(
            roles: [.api, .deletion, .notifications],
            extra: ["BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1"])
        let user = try broker.signInUser(withCode: false)
        let cookie = try broker.signIn(.compliance)
        let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/", cookie: cookie)))
        let confirmation = try broker.post(
            "/deletions/new", form: [("csrf_token", csrf), ("identify_by", "user_id"), ("value", user.id.uuidString)],
            cookie: cookie)
        #expect(confirmation.bodyText.contains("none (manual revocation will be needed, TN3194)"))
        let html = confirmation.bodyText
        let code = try #require(html.range(of: "<span class=\"code\">").map { String(html[$0.upperBound...].prefix(6)) })
        let created = try broker.post(
            "/deletions/create",
            form: [
                ("csrf_token", csrf), ("user_id", user.id.uuidString.lowercased()), ("reason", "asked"), ("ticket", "T-9"),
                ("received_date", "2026-12-01"), ("confirmation_code", code),
            ], cookie: cookie)
        #expect(created.status == 303)
        let report = try #require(created.header("Location")) + "/report"
        try waitForDone(broker)
        #expect(try followUp(broker, report, cookie) == "manual_revocation_required")
        #expect(try broker.get(report, cookie: cookie).bodyText.contains("manual revocation required (TN3194): open"))
        let open = try broker.get("/follow-ups", cookie: cookie)
        #expect(open.status == 200)
        #expect(open.bodyText.contains("1 open of 1"))
        #expect(open.bodyText.contains("Stop Using Apple ID"))

        let notified = try broker.simulator.sendNotification(
            NotificationRequest(
                url: broker.apiURL + "/v1/apple/notifications", type: "consent-revoked", sub: user.sub,
                clientID: ConsoleBroker.clientID))
        #expect(notified.status == 200)
        let closed = try broker.get("/follow-ups", cookie: cookie)
        #expect(closed.bodyText.contains("0 open of 1"))
        #expect(closed.bodyText.contains("closed: the user revoked at Apple"))
        #expect(closed.bodyText.contains("consent-revoked"), "listed among the notifications after a deletion")
        #expect(!closed.bodyText.contains(user.sub))
        // The evidence report tells the same: the follow-up is closed, and when.
        #expect(try followUp(broker, report, cookie) == "manual_revocation_closed")
        let closedReport = try broker.get(report, cookie: cookie).bodyText
        #expect(closedReport.contains("closed, the user revoked at Apple") && !closedReport.contains("required (TN3194): open"))
    }

    /// The `follow_up` member of a deletion's JSON evidence report.
    private func followUp(_ broker: ConsoleBroker, _ report: String, _ cookie: String) throws -> String? {
        let json = try JSONSerialization.jsonObject(with: Data(try broker.get(report + ".json", cookie: cookie).body))
        return (json as? [String: Any])?["follow_up"] as? String
    }

    @Test("a lookup by e-mail leaves no whole sub in the page's source; its reveal works; both cases of one address hash alike")
    func revealByEmailKeepsSubMasked() throws {
        let broker = try ConsoleBroker()
        let user = try broker.signInUser(email: "case.test@example.com")
        let cookie = try broker.signIn(.compliance)
        let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/lookup", cookie: cookie)))
        var result = try broker.post(
            "/lookup", form: [("csrf_token", csrf), ("identify_by", "email"), ("value", "case.test@example.com")],
            cookie: cookie)
        #expect(result.status == 200 && result.bodyText.contains("lead, not proof"))
        #expect(!result.bodyText.contains(user.sub), "the hidden field of the reveal form held the whole sub")
        result = try broker.post(
            "/lookup", form: [("csrf_token", csrf), ("identify_by", "email"), ("value", " Case.Test@EXAMPLE.com")],
            cookie: cookie)
        #expect(result.status == 200 && !result.bodyText.contains(user.sub))
        let named = try #require(ConsoleBroker.hidden("apple_sub", result))
        let revealed = try broker.post(
            "/lookup/reveal",
            form: [("csrf_token", csrf), ("user_id", user.id.uuidString.lowercased()), ("apple_sub", named)], cookie: cookie)
        #expect(revealed.status == 200 && revealed.bodyText.contains("case.test@example.com"))
        let hashes = try broker.pool.query(
            "SELECT detail->>'term_hash' AS h FROM audit_log WHERE action = 'console.lookup' ORDER BY id"
        ).map { try $0.decode(String.self, "h") }
        #expect(hashes.count == 2 && hashes[0] == hashes[1], "one address, one keyed hash, whatever its case")
    }

    @Test("lookup shows masked results; a reveal needs compliance and is audited with the user, never the address or term")
    func lookupAndReveal() throws {
        let broker = try ConsoleBroker()
        let user = try broker.signInUser(email: "reveal.me@example.com")
        let cookie = try broker.signIn(.compliance)
        let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/lookup", cookie: cookie)))
        let result = try broker.post(
            "/lookup", form: [("csrf_token", csrf), ("identify_by", "apple_sub"), ("value", user.sub)], cookie: cookie)
        #expect(result.status == 200)
        #expect(result.bodyText.contains("r•••@example.com (verified"))
        #expect(!result.bodyText.contains("reveal.me"))
        let revealed = try broker.post(
            "/lookup/reveal",
            form: [("csrf_token", csrf), ("user_id", user.id.uuidString.lowercased()), ("apple_sub", user.sub)], cookie: cookie)
        #expect(revealed.status == 200)
        #expect(revealed.bodyText.contains("reveal.me@example.com"))
        let audit = try broker.pool.query(
            "SELECT action, subject, detail::text AS detail FROM audit_log WHERE action IN ('console.lookup', 'console.reveal') ORDER BY id"
        ).map {
            (try $0.decode(String.self, "action"), try $0.decode(String?.self, "subject"), try $0.decode(String.self, "detail"))
        }
        #expect(audit.map(\.0) == ["console.lookup", "console.reveal"])
        #expect(audit[1].1 == user.id.uuidString.lowercased())
        #expect(audit.allSatisfy { !$0.2.contains("reveal.me") && !$0.2.contains(user.sub) })
        // An admin is not compliance: no lookup, no reveal (segregation of duties).
        let admin = try broker.signIn(.admin, operator: "root")
        let adminCSRF = try #require(ConsoleBroker.csrfToken(try broker.get("/", cookie: admin)))
        #expect(
            try broker.post(
                "/lookup/reveal",
                form: [("csrf_token", adminCSRF), ("user_id", user.id.uuidString.lowercased()), ("apple_sub", user.sub)],
                cookie: admin
            ).status == 403)
    }

    @Test(
        "a compliance officer creates a login and read key shown once; an operator revokes it through the confirmation page; the audit export is audited"
    )
    func keysAndAudit() throws {
        let broker = try ConsoleBroker()
        // login and read are the compliance team's scopes (issue 38, item 1); it reads the audit log too.
        let admin = try broker.signIn(.compliance, operator: "root")
        let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/api-keys", cookie: admin)))
        let created = try broker.post(
            "/api-keys", form: [("csrf_token", csrf), ("name", "backend"), ("scopes", "login,read")], cookie: admin)
        #expect(created.status == 201)
        let secret = try #require(
            created.bodyText.range(of: "abk_").map { String(created.bodyText[$0.lowerBound...].prefix { $0 != "<" }) })
        #expect(
            try broker.client.send(
                .init(url: broker.apiURL + "/v1/users/\(UUID())", headers: [("Authorization", "Bearer \(secret)")])
            ).status == 404)
        let list = try broker.get("/api-keys", cookie: admin)
        #expect(list.bodyText.contains("backend") && !list.bodyText.contains(secret))
        let id = try #require(secret.split(separator: "_").dropFirst().first.map(String.init))

        let operatorCookie = try broker.signIn(.operator, operator: "ops")
        let confirm = try broker.get("/api-keys/\(id)/revoke", cookie: operatorCookie)
        #expect(confirm.status == 200)
        let operatorCSRF = try #require(ConsoleBroker.csrfToken(confirm))
        #expect(
            try broker.post(
                "/api-keys", form: [("csrf_token", operatorCSRF), ("name", "x"), ("scopes", "login")], cookie: operatorCookie
            ).status == 403)
        #expect(
            try broker.post("/api-keys/\(id)/revoke", form: [("csrf_token", operatorCSRF)], cookie: operatorCookie).status == 303)
        #expect(try broker.get("/api-keys", cookie: admin).bodyText.contains("revoked "))

        let export = try broker.get("/audit/export?format=csv&actor=console:ops", cookie: admin)
        #expect(export.status == 200)
        #expect(export.header("Content-Type")?.hasPrefix("text/csv") == true)
        let lines = export.bodyText.split(separator: "\r\n")
        #expect(lines.first == "id,at,actor,action,subject,deletion_id,detail,target,outcome")
        #expect(lines.dropFirst().allSatisfy { $0.contains("\"console:ops\"") })
        #expect(lines.count >= 2)
        let jsonl = try broker.get("/audit/export?format=jsonl", cookie: admin)
        #expect(
            jsonl.bodyText.split(separator: "\n").allSatisfy { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) != nil })
        #expect(
            try broker.count("SELECT count(*) FROM audit_log WHERE action = 'console.audit_exported' AND actor = 'console:root'")
                == 2)
        #expect(try broker.get("/audit/export?format=csv", cookie: operatorCookie).status == 403)
    }
}

@Suite("Console webhooks", .offPool)
struct ConsoleWebhookTests {
    @Test("an operator pauses and resumes a subscription; only an admin deletes it, after a confirmation page")
    func subscriptions() throws {
        let broker = try ConsoleBroker()
        let key = try APIKeyStore(pool: broker.pool).create(name: "admin", scopes: [.admin]).secret
        let created = try broker.client.send(
            .init(
                method: "POST", url: broker.apiURL + "/v1/webhook-subscriptions",
                headers: [("Content-Type", "application/json"), ("Authorization", "Bearer \(key)")],
                body: Array(#"{"url":"https://receiver.example/hook","topics":["user.deleted"]}"#.utf8)))
        #expect(created.status == 201, "\(created.bodyText)")
        let id = try #require(
            (try JSONSerialization.jsonObject(with: Data(created.body)) as? [String: Any])?["id"] as? String)
        let viewer = try broker.signIn(.viewer, operator: "val")
        let listed = try broker.get("/webhooks", cookie: viewer)
        #expect(listed.bodyText.contains("https://receiver.example/hook"))
        #expect(!listed.bodyText.contains("/pause\""), "a viewer sees no actions")

        let ops = try broker.signIn(.operator, operator: "ops")
        let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/webhooks", cookie: ops)))
        #expect(try broker.post("/webhooks/\(id)/pause", form: [("csrf_token", csrf)], cookie: ops).status == 303)
        #expect(try broker.count("SELECT count(*) FROM webhook_subscriptions WHERE status = 'paused'") == 1)
        #expect(try broker.post("/webhooks/\(id)/resume", form: [("csrf_token", csrf)], cookie: ops).status == 303)
        #expect(try broker.count("SELECT count(*) FROM webhook_subscriptions WHERE status = 'active'") == 1)
        #expect(try broker.post("/webhooks/\(id)/delete", form: [("csrf_token", csrf)], cookie: ops).status == 403)

        let admin = try broker.signIn(.admin, operator: "root")
        let confirm = try broker.get("/webhooks/\(id)/delete", cookie: admin)
        #expect(confirm.status == 200 && confirm.bodyText.contains("user.deleted"))
        let adminCSRF = try #require(ConsoleBroker.csrfToken(confirm))
        #expect(try broker.post("/webhooks/\(id)/delete", form: [("csrf_token", adminCSRF)], cookie: admin).status == 303)
        #expect(try broker.count("SELECT count(*) FROM webhook_subscriptions") == 0)
        // An admin creates one in the console; the secret is shown once; an operator may not.
        #expect(
            try broker.post(
                "/webhooks", form: [("csrf_token", csrf), ("url", "https://receiver.example/h"), ("topics", "user.deleted")],
                cookie: ops
            ).status == 403)
        let made = try broker.post(
            "/webhooks", form: [("csrf_token", adminCSRF), ("url", "https://receiver.example/h"), ("topics", "user.deleted")],
            cookie: admin)
        #expect(made.status == 201 && made.bodyText.contains("whsec_"))
        #expect(
            try broker.post(
                "/webhooks", form: [("csrf_token", adminCSRF), ("url", "ftp://x"), ("topics", "user.deleted")], cookie: admin
            ).status == 400)
        #expect(try broker.count("SELECT count(*) FROM webhook_subscriptions WHERE topics = '[\"user.deleted\"]'") == 1)
        #expect(try broker.count("SELECT count(*) FROM audit_log WHERE actor = 'console:ops'") >= 2)
    }
}
