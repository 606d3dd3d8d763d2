import HTTPServer

/// The console's route table: the router registers exactly these, and the role × route ×
/// method test reads the same table (docs/console.md lists it for people).
public struct ConsoleRoute: Sendable, Hashable {
    public enum Page: String, Sendable, CaseIterable {
        case stylesheet, signIn, linkForm, linkRedeem, oidcStart, oidcCallback, stepUp, signOut
        case overview
        case deletions, deletionDetail, retryConfirm, retry, newDeletion, identify, createDeletion, report, reportJSON, extend
        case followUps, lookupForm, lookup, reveal
        case notifications, webhooks, createSubscription, pauseSubscription, resumeSubscription, deleteSubscriptionConfirm,
            deleteSubscription
        case redriveDelivery, apiKeys, createAPIKey, revokeAPIKeyConfirm, revokeAPIKey, audit, auditExport
    }

    public let page: Page
    public let method: HTTPMethod
    public let pattern: String
    /// Who may use it; nil: anyone, signed in or not (the sign-in pages and the stylesheet).
    public let roles: Set<ConsoleRole>?
    /// Needs a proof of identity from the last five minutes (`auth_time`).
    public let stepUp: Bool

    init(_ page: Page, _ method: HTTPMethod, _ pattern: String, _ roles: Set<ConsoleRole>?, stepUp: Bool = false) {
        self.page = page
        self.method = method
        self.pattern = pattern
        self.roles = roles
        self.stepUp = stepUp
    }

    public static func == (lhs: ConsoleRoute, rhs: ConsoleRoute) -> Bool {
        lhs.method == rhs.method && lhs.pattern == rhs.pattern
    }
    public func hash(into hasher: inout Hasher) {
        hasher.combine(method.rawValue)
        hasher.combine(pattern)
    }

    /// Every route, in the order docs/console.md lists them.
    public static let table: [ConsoleRoute] = [
        ConsoleRoute(.stylesheet, .get, "/console.css", nil),
        ConsoleRoute(.signIn, .get, "/login", nil),
        ConsoleRoute(.linkForm, .get, "/link", nil),
        ConsoleRoute(.linkRedeem, .post, "/link", nil),
        ConsoleRoute(.oidcStart, .get, "/login/oidc", nil),
        ConsoleRoute(.oidcCallback, .get, "/callback", nil),
        ConsoleRoute(.stepUp, .get, "/step-up", .everyone),
        ConsoleRoute(.signOut, .post, "/logout", .everyone),
        ConsoleRoute(.overview, .get, "/", .everyone),
        ConsoleRoute(.deletions, .get, "/deletions", .everyone),
        ConsoleRoute(.newDeletion, .get, "/deletions/new", .compliance),
        ConsoleRoute(.identify, .post, "/deletions/new", .compliance),
        ConsoleRoute(.createDeletion, .post, "/deletions/create", .compliance, stepUp: true),
        ConsoleRoute(.deletionDetail, .get, "/deletions/{id}", .everyone),
        ConsoleRoute(.retryConfirm, .get, "/deletions/{id}/retry", .retriers),
        ConsoleRoute(.retry, .post, "/deletions/{id}/retry", .retriers, stepUp: true),
        ConsoleRoute(.extend, .post, "/deletions/{id}/extend", .compliance),
        ConsoleRoute(.report, .get, "/deletions/{id}/report", .compliance),
        ConsoleRoute(.reportJSON, .get, "/deletions/{id}/report.json", .compliance),
        ConsoleRoute(.followUps, .get, "/follow-ups", .compliance),
        ConsoleRoute(.lookupForm, .get, "/lookup", .compliance),
        ConsoleRoute(.lookup, .post, "/lookup", .compliance),
        ConsoleRoute(.reveal, .post, "/lookup/reveal", .compliance, stepUp: true),
        ConsoleRoute(.notifications, .get, "/notifications", .everyone),
        ConsoleRoute(.webhooks, .get, "/webhooks", .everyone),
        ConsoleRoute(.createSubscription, .post, "/webhooks", .admins),
        ConsoleRoute(.pauseSubscription, .post, "/webhooks/{id}/pause", .webhookOperators),
        ConsoleRoute(.resumeSubscription, .post, "/webhooks/{id}/resume", .webhookOperators),
        ConsoleRoute(.deleteSubscriptionConfirm, .get, "/webhooks/{id}/delete", .admins),
        ConsoleRoute(.deleteSubscription, .post, "/webhooks/{id}/delete", .admins, stepUp: true),
        ConsoleRoute(.redriveDelivery, .post, "/webhooks/deliveries/{id}/retry", .webhookOperators),
        ConsoleRoute(.apiKeys, .get, "/api-keys", .keyViewers),
        ConsoleRoute(.createAPIKey, .post, "/api-keys", .keyCreators, stepUp: true),
        ConsoleRoute(.revokeAPIKeyConfirm, .get, "/api-keys/{id}/revoke", .webhookOperators),
        ConsoleRoute(.revokeAPIKey, .post, "/api-keys/{id}/revoke", .webhookOperators),
        ConsoleRoute(.audit, .get, "/audit", .auditors),
        ConsoleRoute(.auditExport, .get, "/audit/export", .auditors),
    ]

    public static func route(_ page: Page) -> ConsoleRoute { table.first { $0.page == page }! }
}
