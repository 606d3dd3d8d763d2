import BrokerCore
import Deliveries
import Foundation
import HTTPClient
import HTTPServer
import Observability
import PostgresClient

/// The console on its own listener (`BROKER_CONSOLE_LISTEN`), never on the API's: the
/// route table's pages behind `ConsoleGate`, every response with the console's headers.
public final class ConsoleServer: Sendable {
    let server: HTTPServer
    public let configuration: ConsoleConfiguration
    public let sessions: ConsoleSessionStore

    /// - Parameters:
    ///   - deletions: the deletion service the compliance API uses too.
    ///   - subscriptions: the webhook subscriptions the events API manages.
    ///   - hasher: keys the hashes of looked-up terms in the audit log.
    ///   - apps: the configured app groups (the overview's last notification per app).
    ///   - clientIDs: `APPLE_CLIENT_IDS`, what a key made here may be limited to.
    ///   - trustedProxies: `BROKER_TRUSTED_PROXIES`, as the API's listener takes them.
    ///   - logoutQueue: the provider's Back-Channel Logout queue, for the overview's chart.
    package init(
        configuration: ConsoleConfiguration, pool: PostgresPool, deletions: DeletionService,
        subscriptions: WebhookSubscriptionStore, teamID: String, hasher: SubjectHasher,
        apps: AppGroups = AppGroups(groups: []), clientIDs: [String] = [],
        keySetAge: @escaping @Sendable () -> Duration? = { nil },
        metrics: MetricsRegistry? = nil, trustedProxies: [ClientAddress.Range] = [], logger: Logger,
        transport: any HTTPTransport = CurlTransport(), logoutQueue: DeliveryQueueStore? = nil
    ) {
        self.configuration = configuration
        var rolesOfGroups: (@Sendable ([String]) -> Set<ConsoleRole>)? = nil
        if let oidc = configuration.oidc { rolesOfGroups = { oidc.roles(of: $0) } }
        let sessions = ConsoleSessionStore(
            pool: pool, idle: configuration.sessionIdle, maximum: configuration.sessionMaximum,
            oidcTransactionLimit: configuration.oidcTransactionLimit, rolesOfGroups: rolesOfGroups)
        self.sessions = sessions
        let failures = SignInFailures(
            sessions: sessions, logger: logger.labelled("console"), rate: configuration.failedSignInAuditsPerSecond,
            burst: Double(configuration.failedSignInAuditBurst))
        let store = ConsoleStore(
            deletions: deletions, sessions: sessions, webhooks: subscriptions, teamID: teamID, logoutQueue: logoutQueue)
        var gate = ConsoleGate(sessions: sessions, stepUpWindow: configuration.stepUpWindow)
        gate.origin = ConsoleGate.origin(of: configuration.publicURL)
        let signIn = SignInPages(
            sessions: sessions,
            redemptions: RateLimiter(rate: configuration.linkRedemptionsPerSecond, burst: 10),
            oidcConfigured: configuration.oidc != nil, failures: failures)
        let overview = OverviewPage(
            store: store, apps: apps, silence: configuration.notificationSilence, keySetAge: keySetAge,
            appleCalls: { metrics?.registeredCounter("apple_requests_total")?.samples ?? [] }, deletions: deletions.store)
        let oidc = configuration.oidc.map { settings in
            OIDCPages(
                client: OIDCClient(settings: settings, redirectURI: configuration.publicURL + "/callback", transport: transport),
                sessions: sessions, stepUpWindow: configuration.stepUpWindow, starts: RateLimiter(rate: 1, burst: 30),
                failures: failures, logger: logger.labelled("console"))
        }
        let termHash: @Sendable (String) -> String = { hasher.hash(teamID: "console-lookup", sub: $0) }
        let lookup = ExactLookup(store: store, termHash: termHash)
        let deletions = DeletionPages(service: deletions, store: store, finder: lookup)
        let followUps = FollowUpPages(store: store, finder: lookup)
        let operations = OperationsPages(
            store: store, subscriptions: subscriptions, apiKeys: APIKeyStore(pool: pool), sessions: sessions,
            hasher: hasher, clientIDs: Set(clientIDs).union(apps.allClientIDs))
        var router = Router()
        for route in ConsoleRoute.table {
            let page: ConsoleHandler
            switch route.page {
            case .stylesheet:
                page = { _ in
                    HTTPResponse.text(Layout.stylesheet, contentType: "text/css; charset=utf-8")
                }
            case .signIn: page = signIn.signIn
            case .linkForm: page = signIn.linkForm
            case .linkRedeem: page = signIn.redeem
            case .oidcStart: page = oidc.map { $0.start } ?? Self.notFound
            case .oidcCallback: page = oidc.map { $0.callback } ?? Self.notFound
            case .stepUp: page = oidc.map { $0.stepUp } ?? signIn.stepUp
            case .signOut: page = signIn.signOut
            case .overview: page = overview.render
            case .deletions: page = deletions.list
            case .deletionDetail: page = deletions.detail
            case .retryConfirm: page = deletions.retryConfirm
            case .retry: page = deletions.retry
            case .newDeletion: page = deletions.newForm
            case .identify: page = deletions.identify
            case .createDeletion: page = deletions.create
            case .report: page = deletions.report
            case .reportJSON: page = deletions.reportJSON
            case .extend: page = deletions.extend
            case .followUps: page = followUps.followUps
            case .lookupForm: page = followUps.lookupForm
            case .lookup: page = followUps.lookup
            case .reveal: page = followUps.reveal
            case .notifications: page = operations.notifications
            case .webhooks: page = operations.webhooks
            case .createSubscription: page = operations.createSubscription
            case .pauseSubscription: page = operations.pause
            case .resumeSubscription: page = operations.resume
            case .deleteSubscriptionConfirm: page = operations.deleteConfirm
            case .deleteSubscription: page = operations.delete
            case .redriveDelivery: page = operations.redrive
            case .apiKeys: page = operations.apiKeys
            case .createAPIKey: page = operations.createKey
            case .revokeAPIKeyConfirm: page = operations.revokeConfirm
            case .revokeAPIKey: page = operations.revoke
            case .audit: page = operations.audit
            case .auditExport: page = operations.auditExport
            }
            router.on(route.method, route.pattern, gate.handler(for: route, page))
        }
        var server = HTTPServer.Configuration()
        server.listen = configuration.listen
        server.workerThreads = 4
        server.connectionLimit = 256
        server.maximumBodyBytes = ConsoleGate.maximumFormBytes
        server.responseHeaders = Layout.headers
        // The client address behind the proxies the API trusts (BROKER_TRUSTED_PROXIES): the
        // sign-in budgets and the access log count each operator, not the proxy.
        server.trustedProxies = trustedProxies
        // Unknown paths, wrong methods and over-long forms get a page, not problem+json.
        server.problemRenderer = { problem, _ in
            var response = Layout.refusal(problem.status, problem.title, problem.detail ?? problem.title, session: nil)
            for (name, value) in problem.headers { response.headers.set(name, value) }
            response.headers.set("X-Console-Refusal", problem.code)
            return response
        }
        self.server = HTTPServer(
            configuration: server, router: router, logger: logger.labelled("console"), metrics: MetricsRegistry())
    }

    private static let notFound: ConsoleHandler = { _ in throw ConsoleRefusal.notFound }

    public func start() throws { try server.start() }
    public func shutdown() { server.shutdown() }
    public var port: UInt16 { server.port }
}
