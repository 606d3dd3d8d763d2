import AppleSimulator
import BrokerCore
import Console
import Foundation
import HTTPClient
import PostgresClient
import TestSupport
import Testing

/// The overview's Apple notification health per app (sql/0019).
@Suite("Console overview", .offPool)
struct ConsoleOverviewTests {
    /// Two app groups: the sign-in app (with a web client id) and another app.
    private static let apps = [
        "APPLE_CLIENT_IDS": "\(ConsoleBroker.clientID),com.example.web,com.other.app",
        "APPLE_APP_GROUPS": "\(ConsoleBroker.clientID)=com.example.web;com.other.app",
    ]

    /// The overview's row for one app, from its `<tr>` to the next.
    private func row(_ app: String, _ html: String) throws -> String {
        let start = try #require(html.range(of: "<tr><td>\(app)</td>"))
        return String(html[start.upperBound...].prefix { $0 != "\n" }.components(separatedBy: "</tr>")[0])
    }

    @Test("a notification records its app (aud); the overview shows the last one per app group and warns past the threshold")
    func lastNotificationPerApp() throws {
        let broker = try ConsoleBroker(roles: [.api, .notifications], extra: Self.apps)
        let user = try broker.signInUser()
        let sent = try broker.simulator.sendNotification(
            NotificationRequest(
                url: broker.apiURL + "/v1/apple/notifications", type: "email-disabled", sub: user.sub,
                clientID: ConsoleBroker.clientID))
        #expect(sent.status == 200)
        let stored = try broker.pool.query("SELECT client_id FROM apple_notifications").map { try $0.decode(String?.self, 0) }
        #expect(stored == [ConsoleBroker.clientID])

        let cookie = try broker.signIn(.viewer)
        let fresh = try broker.get("/", cookie: cookie).bodyText
        #expect(fresh.contains("Last Apple notification per app"))
        #expect(try row(ConsoleBroker.clientID, fresh).contains("com.example.web"))
        #expect(!(try row(ConsoleBroker.clientID, fresh).contains("no notification for over")))
        #expect(try row("com.other.app", fresh).contains("none since"))
        #expect(!(try row("com.other.app", fresh).contains("no notification for over")))

        // Eight days later (the default threshold is 7 days): both apps warn, and so does the total.
        try broker.pool.query("UPDATE apple_notifications SET received_at = received_at - interval '8 days'")
        let silent = try broker.get("/", cookie: cookie).bodyText
        #expect(try row(ConsoleBroker.clientID, silent).contains("no notification for over 7 days"))
        #expect(try row("com.other.app", silent).contains("no notification for over 7 days"))
        #expect(silent.components(separatedBy: "no notification for over 7 days").count == 4, "two apps and the total")
    }

    @Test("the threshold is BROKER_CONSOLE_NOTIFICATION_SILENCE_SECONDS")
    func thresholdSetting() throws {
        let broker = try ConsoleBroker(roles: [.api, .notifications], extra: Self.apps) {
            $0.notificationSilence = .seconds(3 * 86_400)
        }
        let user = try broker.signInUser()
        let sent = try broker.simulator.sendNotification(
            NotificationRequest(
                url: broker.apiURL + "/v1/apple/notifications", type: "email-enabled", sub: user.sub, clientID: "com.other.app"))
        #expect(sent.status == 200)
        try broker.pool.query("UPDATE apple_notifications SET received_at = received_at - interval '4 days'")
        let page = try broker.get("/", cookie: try broker.signIn(.viewer)).bodyText
        #expect(try row("com.other.app", page).contains("no notification for over 3 days"))

        let configured = try ConsoleConfiguration.load(
            environment: ["BROKER_CONSOLE_LISTEN": "127.0.0.1:8081", "BROKER_CONSOLE_NOTIFICATION_SILENCE_SECONDS": "86400"],
            apiListen: "127.0.0.1:8080")
        #expect(configured?.notificationSilence == .seconds(86_400))
        #expect(
            throws: ConsoleConfiguration.Invalid.self,
            performing: {
                try ConsoleConfiguration.load(
                    environment: [
                        "BROKER_CONSOLE_LISTEN": "127.0.0.1:8081", "BROKER_CONSOLE_NOTIFICATION_SILENCE_SECONDS": "60",
                    ],
                    apiListen: "127.0.0.1:8080")
            })
    }

    @Test("the previous release's call (the released function alone) still works and leaves the app unset, which no app counts")
    func previousReleaseWrites() throws {
        let broker = try ConsoleBroker(extra: Self.apps)
        let outcome = try broker.pool.query(
            """
            SELECT broker_apply_notification('old-release-jti', 'consent-revoked', \(ConsoleBroker.teamID), 'unknown.sub',
                now(), \(ConsoleBroker.clientID), ARRAY[\(ConsoleBroker.clientID)], 'k1:abc')
            """
        ).single().decode(String.self, 0)
        #expect(outcome == "unknown_subject")
        #expect(try broker.count("SELECT count(*) FROM apple_notifications WHERE client_id IS NULL") == 1)
        let page = try broker.get("/", cookie: try broker.signIn(.viewer)).bodyText
        #expect(try row(ConsoleBroker.clientID, page).contains("none received yet"))
    }
}

/// The overview's pictures of the last days (issue 38, item 9).
@Suite("Console overview charts", .offPool)
struct ConsoleOverviewChartTests {
    /// The rows of one chart's figures table: its cells, day first.
    private func figures(_ chart: String, _ html: String) throws -> [[String]] {
        let start = try #require(html.range(of: "<figure class=\"chart\" id=\"\(chart)\">"), "\(chart)")
        let figure = String(html[start.upperBound...].prefix { _ in true }.components(separatedBy: "</figure>")[0])
        let body = try #require(figure.components(separatedBy: "<tbody>").last?.components(separatedBy: "</tbody>").first)
        return body.components(separatedBy: "<tr>").dropFirst().map { row in
            row.components(separatedBy: "<td>").dropFirst().map { $0.components(separatedBy: "</td>")[0] }
        }
    }

    private func headers(_ chart: String, _ html: String) throws -> [String] {
        let start = try #require(html.range(of: "<figure class=\"chart\" id=\"\(chart)\">"))
        let figure = String(html[start.upperBound...]).components(separatedBy: "</figure>")[0]
        let head = try #require(figure.components(separatedBy: "<thead>").last?.components(separatedBy: "</thead>").first)
        return head.components(separatedBy: "<th scope=\"col\">").dropFirst().map { $0.components(separatedBy: "</th>")[0] }
    }

    @Test(
        "the overview draws the last 14 days as SVG with every figure in a table: deletions and Apple's answers by outcome, notifications per app group (six named, the rest together), both backlogs"
    )
    func charts() throws {
        // Eight apps, each its own group: more than the chart names.
        let ids = [ConsoleBroker.clientID] + (2...8).map { "com.example.app\($0)" }
        let broker = try ConsoleBroker(
            extra: ["APPLE_CLIENT_IDS": ids.joined(separator: ","), "APPLE_APP_GROUPS": ids.joined(separator: ";")])
        // Deletions: one done two days ago, one failed and one under way today, one done 20 days ago.
        for (state, ago) in [("done", 2), ("failed", 0), ("requested", 0), ("done", 20)] {
            try broker.pool.query(
                """
                INSERT INTO deletion_requests (id, user_id, source, reason, requested_by, state, created_at)
                VALUES (gen_random_uuid(), gen_random_uuid(), 'api', 'asked', 'test', \(state), now() - make_interval(days => \(ago)))
                """)
        }
        // Apple's answers to the job today; steps that are no answer of Apple's do not count.
        let failed = try broker.pool.query("SELECT id FROM deletion_requests WHERE state = 'failed'").single().decode(
            UUID.self, 0)
        for (step, outcome) in [
            ("revoke", "revoked"), ("revoke", "retry"), ("code_exchange", "code_invalid"), ("revoke", "skipped"),
            ("purge", "done"),
        ] {
            try broker.pool.query(
                "INSERT INTO deletion_steps (deletion_id, step, outcome) VALUES (\(failed), \(step), \(outcome))")
        }
        // Notifications today: app k gets 9 - k of them, two came without their app, one is 20 days old.
        for (position, id) in ids.enumerated() {
            for index in 0..<(8 - position) {
                try broker.pool.query(
                    "INSERT INTO apple_notifications (jti, event_type, outcome, client_id) VALUES (\("\(id)-\(index)"), 'email-enabled', 'applied', \(id))"
                )
            }
        }
        try broker.pool.query(
            """
            INSERT INTO apple_notifications (jti, event_type, outcome, client_id, received_at) VALUES
              ('none-1', 'consent-revoked', 'unknown_subject', NULL, now()), ('none-2', 'consent-revoked', 'unknown_subject', NULL, now()),
              ('old-1', 'consent-revoked', 'applied', \(ConsoleBroker.clientID), now() - interval '20 days')
            """)
        // Webhooks: one delivery waiting today, one dead letter queued 30 days ago (the first day's bar).
        let admin = try broker.signIn(.admin)
        let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/webhooks", cookie: admin)))
        #expect(
            try broker.post(
                "/webhooks", form: [("csrf_token", csrf), ("url", "https://hooks.example.com/in"), ("topics", "*")], cookie: admin
            ).status == 201)
        _ = try broker.signInUser()
        _ = try broker.signInUser()
        try broker.pool.query(
            """
            UPDATE webhook_deliveries SET state = 'failed', created_at = now() - interval '30 days'
            WHERE id = (SELECT min(id) FROM webhook_deliveries)
            """)

        let html = try broker.get("/", cookie: try broker.signIn(.viewer)).bodyText
        #expect(html.components(separatedBy: "<figure class=\"chart\"").count == 6, "five charts")
        #expect(html.components(separatedBy: "<svg class=\"chart\"").count == 6)
        #expect(!html.contains("<script") && !html.contains(" style="), "no script, no inline style (CSP)")
        #expect(
            html.contains(
                "aria-label=\"Deletions opened, by outcome now, last 14 days: done 1, failed 1, in progress 1\""))
        let today = RFC3339Day.today
        let deletions = try figures("chart-deletions", html)
        #expect(deletions.count == 14)
        #expect(deletions.last == [today, "0", "1", "1", "2"])
        #expect(deletions[11] == [RFC3339Day.daysAgo(2), "1", "0", "0", "1"])
        #expect(deletions.dropLast().reduce(0) { $0 + Int($1[4])! } == 1, "the 20-day-old one is out of the picture")
        #expect(try figures("chart-apple", html).last == [today, "1", "0", "1", "1", "3"])
        let groups = try headers("chart-notifications", html)
        #expect(groups == ["Day"] + ids.prefix(6) + ["other app groups", "app not recorded", "Total"])
        #expect(try figures("chart-notifications", html).last == [today, "8", "7", "6", "5", "4", "3", "3", "2", "38"])
        let webhooks = try figures("chart-webhooks", html)
        #expect(webhooks.first?.dropFirst().map { $0 } == ["0", "1", "1"], "older than the window: on the first day")
        #expect(webhooks.last == [today, "1", "0", "1"])
        #expect(try figures("chart-logouts", html).allSatisfy { $0.dropFirst() == ["0", "0", "0"] })
        // The deletions chart's bars: one for day -2, two for today.
        let deletionSVG = try #require(
            html.components(separatedBy: "id=\"chart-deletions\"").last?.components(separatedBy: "</svg>").first)
        #expect(deletionSVG.components(separatedBy: "<rect ").count - 1 == 3)
    }
}

enum RFC3339Day {
    static func daysAgo(_ days: Int) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withFullDate]
        return formatter.string(from: Date().addingTimeInterval(-Double(days) * 86_400))
    }
    static var today: String { daysAgo(0) }
}

/// The Apple notifications page's refresh-token sweep findings (console-design.md (b)5).
@Suite("Console sweep findings", .offPool)
struct ConsoleSweepFindingsTests {
    @Test("tokens the sweep found dead without a notification are listed by user id and subject hash, never the sub")
    func sweepFindings() throws {
        let broker = try ConsoleBroker(roles: [.api, .notifications])
        let silent = try broker.signInUser()
        let told = try broker.signInUser()
        let live = try broker.signInUser()
        // What the sweep does on Apple's invalid_grant (RefreshTokenStore.invalidateToken).
        try broker.pool.query(
            """
            SELECT broker_invalidate_token(id, client_id, 'refresh_sweep', 'invalid_grant') FROM apple_tokens
            WHERE user_id = ANY (ARRAY[\(silent.id), \(told.id)]::uuid[])
            """)
        // Apple did tell about this one (its deletion waits: no deletion worker here).
        let sent = try broker.simulator.sendNotification(
            NotificationRequest(
                url: broker.apiURL + "/v1/apple/notifications", type: "account-delete", sub: told.sub,
                clientID: ConsoleBroker.clientID))
        #expect(sent.status == 200)

        let page = try broker.get("/notifications", cookie: try broker.signIn(.viewer))
        #expect(page.status == 200)
        let html = page.bodyText
        let section = try #require(html.range(of: "Refresh-token sweep findings").map { String(html[$0.upperBound...]) })
        #expect(section.contains("1 refresh token(s)"))
        #expect(section.contains(silent.id.lowercasedString))
        #expect(!section.contains(told.id.lowercasedString), "Apple sent a notification about it")
        #expect(!section.contains(live.id.lowercasedString), "its token is alive")
        #expect(!html.contains(silent.sub) && !html.contains(told.sub))
        let hash = try broker.pool.query("SELECT sub_hash FROM apple_notifications").single().decode(String.self, 0)
        #expect(!section.contains(String(hash.prefix(24))), "the notified subject's hash is not a finding")
        #expect(section.contains("<td>invalid_grant</td>"))
    }
}
