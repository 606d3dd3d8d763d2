import Console
import Foundation
import HTTPClient
import HTTPServer
import PostgresClient
import TestSupport
import Testing

/// What an outsider or a careless paste can put in a console form or URL: a NUL, a control
/// character, bad percent-encoding, a repeated field, an over-long value, an id that is no
/// UUID. The answer is a 4xx page, never a 500, and no row is written for it.
@Suite("Console hostile input", .offPool)
struct ConsoleHostileInputTests {
    /// `name=value&…` sent as it is (percent-encoding included), with the session's cookie.
    private func postRaw(_ broker: ConsoleBroker, _ path: String, _ body: String, cookie: String) throws
        -> HTTPClientResponse
    {
        try broker.client.send(
            .init(
                method: "POST", url: broker.consoleURL + path,
                headers: [
                    ("Content-Type", "application/x-www-form-urlencoded"), ("Cookie", "__Host-console=\(cookie)"),
                ], body: Array(body.utf8)))
    }

    private func rows(_ broker: ConsoleBroker) throws -> [Int] {
        [
            try broker.count("SELECT count(*) FROM deletion_requests"), try broker.count("SELECT count(*) FROM audit_log"),
            try broker.count("SELECT count(*) FROM api_keys"),
        ]
    }

    @Test("a NUL in the ticket of a new deletion is refused with 400 before anything is written")
    func nulInTicket() throws {
        let broker = try ConsoleBroker()
        let user = try broker.signInUser(email: "nul@example.com")
        let cookie = try broker.signIn(.compliance)
        let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/deletions/new", cookie: cookie)))
        let confirmation = try broker.post(
            "/deletions/new", form: [("csrf_token", csrf), ("identify_by", "user_id"), ("value", user.id.uuidString)],
            cookie: cookie)
        let html = confirmation.bodyText
        let code = try #require(html.range(of: "<span class=\"code\">").map { String(html[$0.upperBound...].prefix(6)) })
        let before = try rows(broker)
        let created = try broker.post(
            "/deletions/create",
            form: [
                ("csrf_token", csrf), ("user_id", user.id.uuidString.lowercased()), ("reason", "user asked"),
                ("ticket", "DSR-\u{0}1"), ("received_date", "2026-11-30"), ("confirmation_code", code),
            ], cookie: cookie)
        #expect(created.status == 400, "\(created.status) \(created.bodyText)")
        #expect(created.header("X-Console-Refusal") == "console_invalid")
        #expect(try rows(broker) == before)
    }

    @Test("every POST route answers hostile forms with a 4xx and writes no row")
    func hostileForms() throws {
        // A step-up window longer than the test, so every step-up route reaches its form.
        let broker = try ConsoleBroker(configure: { $0.stepUpWindow = .seconds(3600) })
        let notUUID = "not-a-uuid"
        let long = String(repeating: "a", count: 4000)
        let bodies = [
            "", "csrf_token=%00", "value=%00&identify_by=email", "identify_by=%FF%FE&value=x", "value=a&value=b",
            "identify_by=apple_sub&value=\(long)", "identify_by=apple_sub&value=a%00b", "identify_by=email&value=a%01@b",
            "user_id=\(notUUID)&reason=r&ticket=t&received_date=2026-11-30&confirmation_code=AAAAAA",
            "user_id=\(notUUID)&apple_sub=x", "name=k%00&scopes=login", "name=\(long)&scopes=login",
            "url=https://a.example/%00&topics=user.deleted", "extended_until=2026-13-45&extension_reason=%00",
            "%00=x", "a=%",
        ]
        for role in [ConsoleRole.compliance, .admin, .operator] {
            let cookie = try broker.signIn(role, operator: "hostile-\(role)")
            let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/", cookie: cookie)))
            for route in ConsoleRoute.table where route.method == .post && route.roles?.contains(role) == true {
                guard route.page != .signOut else { continue }
                let ids =
                    route.pattern.contains("{id}")
                    ? [notUUID, UUID().uuidString.lowercased(), "%00", String(repeating: "9", count: 300)] : [""]
                for id in ids {
                    let path = route.pattern.replacingOccurrences(of: "{id}", with: id)
                    for body in bodies {
                        let before = try rows(broker)
                        let response = try postRaw(broker, path, "csrf_token=\(csrf)&" + body, cookie: cookie)
                        let what = "\(role) POST \(path) [\(body.prefix(60))]: \(response.status)"
                        #expect((400..<500).contains(response.status), "\(what)")
                        #expect(try rows(broker) == before, "\(what)")
                    }
                }
            }
        }
    }

    @Test(
        "the audit filter refuses a control character with 400; the export's own audit row records the known filter fields only")
    func auditFilter() throws {
        let broker = try ConsoleBroker()
        let cookie = try broker.signIn(.admin, operator: "root")
        // (The server cuts a query value at a NUL; the other control characters arrive.)
        for path in ["/audit?actor=%01", "/audit/export?format=csv&subject=a%1Bb", "/audit?action=x%7F"] {
            let response = try broker.get(path, cookie: cookie)
            #expect(response.status == 400, "\(path): \(response.status)")
        }
        #expect(try broker.count("SELECT count(*) FROM audit_log WHERE action = 'console.audit_exported'") == 0)
        let export = try broker.get("/audit/export?format=jsonl&actor=console:root&junk=%01&note=secret", cookie: cookie)
        #expect(export.status == 200, "\(export.bodyText)")
        let detail = try broker.pool.query(
            "SELECT detail->>'filter' AS filter FROM audit_log WHERE action = 'console.audit_exported'"
        ).single().decode(String.self, "filter")
        #expect(detail == "actor=console:root")
    }
}
