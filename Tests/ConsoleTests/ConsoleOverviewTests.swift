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
