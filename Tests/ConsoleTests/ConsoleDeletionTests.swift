import AppleSimulator
import BrokerCore
import Console
import Foundation
import HTTPClient
import PostgresClient
import TestSupport
import Testing

/// The deletion journey through the console, against the deletion job and the Apple
/// simulator: identify, confirm with masked identities and a typed code, states shown
/// truthfully while Apple fails, retry, and the evidence without personal data.
@Suite("Console deletions", .offPool)
struct ConsoleDeletionTests {
    static let fast = [
        "BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1", "BROKER_DELETION_MAX_ATTEMPTS": "2",
    ]

    private func waitFor(_ broker: ConsoleBroker, _ id: String, state: String, seconds: Double = 30) throws {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if try broker.count("SELECT count(*) FROM deletion_requests WHERE id = \(id)::uuid AND state = \(state)") == 1 {
                return
            }
            Thread.sleep(forTimeInterval: 0.1)
        }
        Issue.record("deletion \(id) never reached \(state)")
    }

    /// Opens a deletion through the pages, as a compliance officer; returns its id.
    private func openDeletion(_ broker: ConsoleBroker, cookie: String, by kind: String, value: String) throws -> String {
        let form = try broker.get("/deletions/new", cookie: cookie)
        #expect(form.status == 200)
        let csrf = try #require(ConsoleBroker.csrfToken(form))
        let confirmation = try broker.post(
            "/deletions/new", form: [("csrf_token", csrf), ("identify_by", kind), ("value", value)], cookie: cookie)
        #expect(confirmation.status == 200, "\(confirmation.bodyText)")
        let html = confirmation.bodyText
        let userID = try #require(ConsoleBroker.hidden("user_id", confirmation))
        let code = try #require(
            html.range(of: "<span class=\"code\">").map { String(html[$0.upperBound...].prefix(6)) })
        // A wrong code is refused and opens nothing.
        let wrong = try broker.post(
            "/deletions/create",
            form: [
                ("csrf_token", csrf), ("user_id", userID), ("reason", "user asked"), ("ticket", "DSR-1"),
                ("received_date", "2026-11-30"), ("confirmation_code", "AAAAAA"),
            ], cookie: cookie)
        #expect(wrong.status == 400)
        #expect(try broker.count("SELECT count(*) FROM deletion_requests") == 0)
        let created = try broker.post(
            "/deletions/create",
            form: [
                ("csrf_token", csrf), ("user_id", userID), ("reason", "user asked"), ("ticket", "DSR-1"),
                ("received_date", "2026-11-30"), ("confirmation_code", code.lowercased()),
            ], cookie: cookie)
        #expect(created.status == 303, "\(created.bodyText)")
        let location = try #require(created.header("Location"))
        #expect(location.hasPrefix("/deletions/"))
        return String(location.dropFirst("/deletions/".count))
    }

    @Test("identify by e-mail shows a masked lead; the confirmation page holds no sub or address in full")
    func confirmationIsMasked() throws {
        let broker = try ConsoleBroker()
        let user = try broker.signInUser(email: "Jane.Doe@example.com")
        let cookie = try broker.signIn(.compliance)
        let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/deletions/new", cookie: cookie)))
        let page = try broker.post(
            "/deletions/new", form: [("csrf_token", csrf), ("identify_by", "email"), ("value", " jane.doe@EXAMPLE.com ")],
            cookie: cookie)
        #expect(page.status == 200)
        let html = page.bodyText
        #expect(!html.contains(user.sub))
        #expect(!html.lowercased().contains("jane.doe"))
        #expect(html.contains("J•••@example.com"))
        #expect(html.contains("a lead, not proof of identity"))
        #expect(html.contains(ConsoleBroker.clientID))
        // No pattern search: a part of the address finds nothing.
        let partial = try broker.post(
            "/deletions/new", form: [("csrf_token", csrf), ("identify_by", "email"), ("value", "jane.doe@example")],
            cookie: cookie)
        #expect(partial.status == 404)
        // Each lookup audited with a keyed hash of the term, never the term.
        let details = try broker.pool.query("SELECT detail::text AS d FROM audit_log WHERE action = 'console.lookup'").map {
            try $0.decode(String.self, "d")
        }
        #expect(details.count == 2)
        #expect(details.allSatisfy { !$0.lowercased().contains("jane") && $0.contains("term_hash") })
    }

    @Test(
        "the journey: opened by compliance, failed while Apple refuses (never 'deleted'), retried by an operator, then done with evidence"
    )
    func journey() throws {
        let broker = try ConsoleBroker(roles: [.api, .deletion], extra: Self.fast)
        let user = try broker.signInUser()
        var faults = FaultSettings()
        faults.errorRate = 1
        faults.errorStatuses = [500]
        faults.endpoints = ["revoke"]
        broker.simulator.faults = faults

        let compliance = try broker.signIn(.compliance, operator: "dpo")
        let id = try openDeletion(broker, cookie: compliance, by: "apple_sub", value: user.sub)
        #expect(
            try broker.count("SELECT count(*) FROM deletion_requests WHERE ticket = 'DSR-1' AND received_at IS NOT NULL") == 1)
        try waitFor(broker, id, state: "failed")

        let viewer = try broker.signIn(.viewer, operator: "val")
        let detail = try broker.get("/deletions/\(id)", cookie: viewer)
        #expect(detail.status == 200)
        #expect(detail.bodyText.contains("Failed: stopped after repeated errors (nothing deleted yet)"))
        #expect(!detail.bodyText.contains("Deleted: account data purged"))
        #expect(detail.bodyText.contains("Apple unavailable, will retry"))
        #expect(!detail.bodyText.contains("/retry\">Retry"), "a viewer is not offered the retry")
        #expect(try broker.get("/deletions?state=failed", cookie: viewer).bodyText.contains(id))
        #expect(!(try broker.get("/deletions?state=done", cookie: viewer).bodyText.contains(id)))

        broker.simulator.faults = FaultSettings()
        let operatorCookie = try broker.signIn(.operator, operator: "ops")
        let confirm = try broker.get("/deletions/\(id)/retry", cookie: operatorCookie)
        #expect(confirm.status == 200)
        let csrf = try #require(ConsoleBroker.csrfToken(confirm))
        let retried = try broker.post("/deletions/\(id)/retry", form: [("csrf_token", csrf)], cookie: operatorCookie)
        #expect(retried.status == 303 && retried.header("Location") == "/deletions/\(id)")
        try waitFor(broker, id, state: "done")
        #expect(try broker.get("/deletions/\(id)", cookie: viewer).bodyText.contains("Deleted: account data purged"))
        let overview = try broker.get("/", cookie: viewer).bodyText
        #expect(overview.contains("<td>revoke</td><td>500</td>") && overview.contains("<td>revoke</td><td>200</td>"))
        // Retrying a deletion that is not failed: 409, nothing changes.
        #expect(try broker.get("/deletions/\(id)/retry", cookie: operatorCookie).status == 409)

        let report = try broker.get("/deletions/\(id)/report.json", cookie: compliance)
        #expect(report.status == 200)
        let json = try #require(try JSONSerialization.jsonObject(with: Data(report.body)) as? [String: Any])
        #expect(json["state"] as? String == "done")
        #expect(json["ticket"] as? String == "DSR-1")
        #expect(json["purged_at"] is String)
        let revocations = try #require(json["revocations"] as? [[String: Any]])
        #expect(
            revocations.contains { $0["client_id"] as? String == ConsoleBroker.clientID && $0["outcome"] as? String == "revoked" }
        )
        #expect(
            revocations.contains { $0["client_id"] as? String == ConsoleBroker.clientID && $0["outcome"] as? String == "retry" })
        #expect(!report.bodyText.contains(user.sub))
        let html = try broker.get("/deletions/\(id)/report", cookie: compliance)
        #expect(html.status == 200 && html.bodyText.contains("Revocation per client id") && !html.bodyText.contains(user.sub))
        #expect(try broker.get("/deletions/\(id)/report", cookie: operatorCookie).status == 403)

        // The audit log names the operators.
        let rows = try broker.pool.query(
            "SELECT actor, action FROM audit_log WHERE deletion_id = \(id)::uuid AND action IN ('console.deletion_requested', 'deletion.retried') ORDER BY id"
        ).map { "\(try $0.decode(String.self, "actor")) \(try $0.decode(String.self, "action"))" }
        #expect(rows == ["console:dpo console.deletion_requested", "console:ops deletion.retried"])
        #expect(try broker.count("SELECT count(*) FROM deletion_requests WHERE requested_by = 'console:dpo'") == 1)
    }

    @Test("compliance extends a deadline within three months of receipt, with a reason; the due date follows; audited")
    func extendDeadline() throws {
        let broker = try ConsoleBroker()
        let user = try broker.signInUser()
        let cookie = try broker.signIn(.compliance, operator: "dpo")
        let id = try openDeletion(broker, cookie: cookie, by: "user_id", value: user.id.uuidString)
        let detail = try broker.get("/deletions/\(id)", cookie: cookie)
        #expect(detail.bodyText.contains("2026-12-30"), "due one month after receipt on 2026-11-30")
        let csrf = try #require(ConsoleBroker.csrfToken(detail))
        for tooLate in ["2027-03-01", "2026-12-15"] {
            let refused = try broker.post(
                "/deletions/\(id)/extend",
                form: [("csrf_token", csrf), ("extended_until", tooLate), ("extension_reason", "complex request")],
                cookie: cookie)
            #expect(refused.status == 400, "\(tooLate)")
        }
        let extended = try broker.post(
            "/deletions/\(id)/extend",
            form: [("csrf_token", csrf), ("extended_until", "2027-02-15"), ("extension_reason", "complex request")],
            cookie: cookie)
        #expect(extended.status == 303)
        let after = try broker.get("/deletions/\(id)", cookie: cookie)
        #expect(after.bodyText.contains("2027-02-15") && after.bodyText.contains("extended: complex request"))
        #expect(try broker.get("/deletions", cookie: cookie).bodyText.contains("2027-02-15"))
        #expect(
            try broker.count(
                "SELECT count(*) FROM audit_log WHERE action = 'console.deletion_extended' AND actor = 'console:dpo'") == 1)
    }
}
