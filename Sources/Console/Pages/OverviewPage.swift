import BrokerCore
import Foundation
import HTTPServer

/// `/`: what needs attention, in figures any role may see (no personal data).
struct OverviewPage {
    let store: ConsoleStore
    /// The configured app groups: each is told about under its primary App ID (Apple's `aud`).
    let apps: AppGroups
    /// Longer than this without an Apple notification is worth a look
    /// (`BROKER_CONSOLE_NOTIFICATION_SILENCE_SECONDS`).
    let silence: Duration
    /// How old the Apple signing keys in memory are (nil: none fetched yet).
    let keySetAge: @Sendable () -> Duration?
    /// Calls to Apple by endpoint and status, counted by this process since it started.
    let appleCalls: @Sendable () -> [(labels: [String], value: Double)]
    /// The deletion job's record (the deletions and Apple's answers charted by day).
    let deletions: DeletionStore

    /// How many days the charts show, and how many app groups the notification chart names
    /// (the rest together as "other app groups"): what a page costs stays the same however
    /// long the broker runs and however many apps it serves.
    static let chartDays = 14
    static let chartGroups = 6

    func render(_ request: ConsoleRequest) throws -> HTTPResponse {
        let figures = try store.overview()
        let last: HTML
        if let at = figures.lastNotification {
            last = "\(RFC3339Date.string(at))\(silenceWarning(since: at))"
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
            \(try perApp())
            \(HTML.table(caption: "Calls to Apple by endpoint and status (this process, since it started)", headers: ["Endpoint", "Status", "Calls"], rows: calls))
            <h2>Console</h2>
            <dl><dt>Open sessions</dt><dd>\(figures.activeSessions)</dd></dl>
            <h2>The last \(Self.chartDays) days</h2>
            \(try charts())
            """)
    }

    /// Deletions by outcome, Apple's answers by outcome, notifications per app group and the
    /// two delivery backlogs, one bar a day (UTC).
    func charts(now: Date = Date()) throws -> HTML {
        let days = DailyChart.lastDays(Self.chartDays, now: now)
        let deletionChart = DailyChart(
            id: "chart-deletions", title: "Deletions opened, by outcome now", days: days,
            counts: try deletions.openedByOutcome(days: Self.chartDays),
            categories: [
                ("done", "done", "c-good"), ("failed", "failed", "c-bad"), ("in_progress", "in progress", "c-wait"),
            ])
        let appleChart = DailyChart(
            id: "chart-apple", title: "Apple’s answers to the deletion job, by outcome", days: days,
            counts: try deletions.appleAnswers(days: Self.chartDays),
            categories: [
                ("revoked", "revoked (or dead already)", "c-good"), ("exchanged", "code exchanged", "c-info"),
                ("refused", "refused", "c-bad"), ("no_answer", "no answer", "c-warn"),
            ])
        let webhookChart = DailyChart(
            id: "chart-webhooks", title: "Webhook backlog, by day queued", days: days,
            counts: try store.backlogByDay(.webhooks, days: Self.chartDays),
            categories: [("pending", "waiting", "c-wait"), ("failed", "dead letters", "c-bad")])
        let logoutChart = DailyChart(
            id: "chart-logouts", title: "Back-channel logout backlog, by day queued", days: days,
            counts: try store.backlogByDay(.logouts, days: Self.chartDays),
            categories: [("pending", "waiting", "c-wait"), ("failed", "failed", "c-bad")])
        return HTML.join(
            [deletionChart.html, appleChart.html, try notificationChart(days: days).html, webhookChart.html, logoutChart.html]
        )
    }

    /// Notifications received per app group (its primary App ID); the groups after the
    /// `chartGroups` busiest together, and those the previous release stored without their app.
    private func notificationChart(days: [Date]) throws -> DailyChart {
        let counts = try store.notificationsByClient(days: Self.chartDays).map { count in
            var count = count
            count.category = count.category.isEmpty ? "" : apps.group(of: count.category).primary
            return count
        }
        var totals: [String: Int] = [:]
        for count in counts where !count.category.isEmpty { totals[count.category, default: 0] += count.count }
        let named = totals.sorted { $0.value != $1.value ? $0.value > $1.value : $0.key < $1.key }.prefix(Self.chartGroups)
            .map(\.key)
        let regrouped = counts.map { count in
            var count = count
            if !count.category.isEmpty && !named.contains(count.category) { count.category = "\u{0}other" }
            return count
        }
        let styles = ["c-info", "c-good", "c-violet", "c-warn", "c-teal", "c-rose"]
        var categories = named.enumerated().map { (key: $1, label: $1, style: styles[$0 % styles.count]) }
        categories.append((key: "\u{0}other", label: "other app groups", style: "c-wait"))
        categories.append((key: "", label: "app not recorded", style: "c-grey"))
        return DailyChart(
            id: "chart-notifications", title: "Apple notifications received, by app group", days: days, counts: regrouped,
            categories: categories)
    }

    /// A warning when `since` is longer ago than the threshold, else nothing.
    private func silenceWarning(since: Date, now: Date = Date()) -> HTML {
        guard now.timeIntervalSince(since) > Double(silence.components.seconds) else { return .empty }
        return
            " <strong class=\"state-failed\">no notification for over \(Self.duration(Double(silence.components.seconds))): check the endpoint</strong>"
    }

    /// The last notification per app group (any of its client ids, sql/0019). An app with none
    /// is warned about once notifications have carried their app for longer than the threshold.
    private func perApp() throws -> HTML {
        guard !apps.groups.isEmpty else { return .empty }
        let (last, attributedSince) = try store.lastNotifications(of: apps.groups.flatMap(\.clientIDs))
        let rows: [[HTML]] = apps.groups.map { group in
            let latest = group.clientIDs.compactMap { last[$0] }.max()
            let cell: HTML
            if let latest {
                cell = "\(RFC3339Date.string(latest))\(silenceWarning(since: latest))"
            } else if let attributedSince {
                cell = "none since \(RFC3339Date.string(attributedSince))\(silenceWarning(since: attributedSince))"
            } else {
                cell = "none received yet"
            }
            return ["\(group.primary)", "\(group.clientIDs.dropFirst().joined(separator: ", "))", cell]
        }
        return HTML.table(
            caption: "Last Apple notification per app (by the primary App ID Apple names in aud)",
            headers: ["App", "Other client ids", "Last notification"], rows: rows)
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
