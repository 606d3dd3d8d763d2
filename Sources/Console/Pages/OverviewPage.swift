import Foundation
import HTTPServer

/// `/`: what needs attention, in figures any role may see (no personal data).
struct OverviewPage {
    let store: ConsoleStore
    /// How old the Apple signing keys in memory are (nil: none fetched yet).
    let keySetAge: @Sendable () -> Duration?
    /// Calls to Apple by endpoint and status, counted by this process since it started.
    let appleCalls: @Sendable () -> [(labels: [String], value: Double)]
    /// Longer than this without an Apple notification is worth a look (they come once per event).
    static let notificationSilenceWarning: TimeInterval = 7 * 86_400

    func render(_ request: ConsoleRequest) throws -> HTTPResponse {
        let figures = try store.overview()
        let last: HTML
        if let at = figures.lastNotification {
            let silent = -at.timeIntervalSinceNow > Self.notificationSilenceWarning
            last =
                "\(RFC3339Date.string(at))\(silent ? HTML(" <strong class=\"state-failed\">no notification for over 7 days: check the endpoint</strong>") : .empty)"
        } else {
            last = "none received yet"
        }
        let calls: [[HTML]] = appleCalls().map { sample in
            let status = sample.labels.count > 1 ? sample.labels[1] : ""
            return ["\(sample.labels.first ?? "")", "\(status == "0" ? "no answer" : status)", "\(Int(sample.value))"]
        }
        return Layout.page(
            "Overview", session: request.session,
            """
            <h2>Deletions</h2>
            <dl><dt>In progress</dt><dd>\(figures.deletionBacklog)</dd>
            <dt>Failed (need a retry)</dt><dd>\(figures.deletionFailed > 0 ? HTML("<a class=\"state-failed\" href=\"/deletions?state=failed\">\(figures.deletionFailed)</a>") : "0")</dd>
            <dt>Oldest pending</dt><dd>\(Self.duration(figures.oldestPendingSeconds))</dd></dl>
            <h2>Webhooks</h2>
            <dl><dt>Subscriptions</dt><dd>\(figures.subscriptions)</dd>
            <dt>Deliveries pending</dt><dd>\(figures.webhookPending)</dd>
            <dt>Dead letters</dt><dd>\(figures.webhookFailed)</dd></dl>
            <h2>Apple</h2>
            <dl><dt>Signing keys fetched</dt><dd>\(keySetAge().map { Self.duration(Double($0.components.seconds)) + " ago" } ?? "not yet (this process serves no logins or notifications, or Apple was unreachable)")</dd>
            <dt>Last notification received</dt><dd>\(last)</dd>
            <dt>Notifications, last 24 hours</dt><dd>\(figures.notifications24h)</dd></dl>
            \(HTML.table(caption: "Calls to Apple by endpoint and status (this process, since it started)", headers: ["Endpoint", "Status", "Calls"], rows: calls))
            <h2>Console</h2>
            <dl><dt>Open sessions</dt><dd>\(figures.activeSessions)</dd></dl>
            """)
    }

    static func duration(_ seconds: Double) -> String {
        switch seconds {
        case ..<1: return "none"
        case ..<3600: return "\(Int(seconds / 60)) min"
        case ..<172_800: return "\(Int(seconds / 3600)) h"
        default: return "\(Int(seconds / 86_400)) days"
        }
    }
}
