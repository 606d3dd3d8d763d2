import Foundation
import HTTPClient
import HTTPServer
import Observability
import PostgresClient

/// The running service: database, HTTP API and background workers, assembled from a
/// configuration and started and stopped as one.
///
/// `start()` returns once everything listens; `stop()` stops accepting requests, waits
/// for in-flight ones, stops workers, closes the pool and, if it started one, the
/// embedded PostgreSQL.
public final class BrokerApplication: Sendable {
    public let configuration: BrokerConfiguration
    public let database: Database
    public let metrics: MetricsRegistry
    public let health = HealthState()
    public let apiKeys: APIKeyAuthenticator
    let logger: Logger
    let listener: PostgresListener
    let server: HTTPServer
    /// `/metrics` alone, when `BROKER_METRICS_LISTEN` is set.
    let metricsServer: HTTPServer?
    /// Apple's signing keys, shared by login and notifications.
    public let appleKeys: AppleKeyCache
    public let apple: AppleClient
    let workers: [WorkerGroup]
    /// Every route this process serves, as `METHOD /pattern` (for the API description's test).
    public let routes: [String]

    /// Opens the database (migrating it) and builds every component; starts nothing.
    /// - Parameter transport: how to reach Apple (the seam tests may replace).
    public init(
        configuration: BrokerConfiguration, logger: Logger, transport: any HTTPTransport = CurlTransport()
    ) throws {
        guard let appleSettings = configuration.apple, let tokenKeys = configuration.tokenKeys else {
            throw BrokerConfiguration.Invalid(problems: ["serve needs the Apple settings and TOKEN_ENCRYPTION_KEY"])
        }
        self.configuration = configuration
        self.logger = logger
        database = try Database.open(configuration, logger: logger)
        try GrantAlignment.align(database.pool, groups: appleSettings.appGroups)
        metrics = MetricsRegistry()
        let pool = database.pool
        apiKeys = APIKeyAuthenticator(
            store: APIKeyStore(pool: pool),
            limiter: RateLimiter(rate: configuration.rateLimitPerKey, burst: configuration.rateLimitPerKey * 2),
            failures: RateLimiter(
                rate: configuration.rateLimitAuthFailuresPerAddress, burst: max(10, configuration.rateLimitAuthFailuresPerAddress * 30)),
            groups: appleSettings.appGroups)
        listener = PostgresListener(configuration: database.connection, logger: logger.labelled("listener"))

        let secrets = ClientSecretProvider(
            teamID: appleSettings.teamID, keyID: appleSettings.keyID, keyPath: appleSettings.privateKeyPath,
            keyIDPath: appleSettings.keyIDPath, metrics: metrics, logger: logger.labelled("apple"))
        let apple = AppleClient(
            baseURL: appleSettings.baseURL, transport: transport, secrets: secrets,
            timeout: .milliseconds(appleSettings.timeoutMilliseconds), metrics: metrics, logger: logger.labelled("apple"))
        self.apple = apple
        appleKeys = AppleKeyCache(
            refreshInterval: .seconds(appleSettings.keysRefreshSeconds), metrics: metrics, logger: logger.labelled("jwks"),
            fetch: { try apple.fetchKeys() })
        let verifier = AppleTokenVerifier(keys: appleKeys)
        let validator = IdentityTokenValidator(
            verifier: verifier, clientIDs: Set(appleSettings.clientIDs),
            leeway: TimeInterval(configuration.login.tokenLeewaySeconds),
            maximumAge: TimeInterval(configuration.login.tokenMaximumAgeSeconds))
        let retry = RetryPolicy(maximumAttempts: appleSettings.maximumAttempts)

        // The deletion job exists before the routes so they can wake it.
        let deletionStore = DeletionStore(pool: pool, teamID: appleSettings.teamID, hasher: SubjectHasher(keys: tokenKeys))
        let deletionWorker: WorkerGroup? =
            configuration.roles.contains(.deletion)
            ? WorkerGroup(
                name: "deletion-job", lanes: configuration.deletion.concurrency,
                interval: .seconds(configuration.deletion.intervalSeconds), logger: logger,
                step: DeletionJob(
                    store: deletionStore, apple: apple, tokenKeys: tokenKeys, settings: configuration.deletion,
                    validator: validator, metrics: metrics, logger: logger.labelled("deletion-job")
                ).step)
            : nil
        let wakeDeletions: @Sendable () -> Void = { deletionWorker?.wake() }
        var subscriptions = WebhookSubscriptionStore(pool: pool, tokenKeys: tokenKeys)
        subscriptions.allowPrivateNetworks = configuration.dispatch.allowPrivateNetworks
        let dispatcher: WorkerGroup? =
            configuration.roles.contains(.dispatch)
            ? WorkerGroup(
                name: "dispatcher", lanes: configuration.dispatch.concurrency,
                interval: .milliseconds(configuration.dispatch.intervalMilliseconds), logger: logger,
                step: WebhookDispatcher(
                    pool: pool, subscriptions: subscriptions, transport: transport,
                    settings: .init(
                        timeout: .milliseconds(configuration.dispatch.timeoutMilliseconds),
                        retryBase: .milliseconds(configuration.dispatch.retryBaseMilliseconds),
                        retryMaximum: .seconds(configuration.dispatch.retryMaximumSeconds),
                        maximumAge: .seconds(configuration.dispatch.maximumAgeSeconds)),
                    metrics: metrics, logger: logger.labelled("dispatcher")
                ).step)
            : nil
        /// Events written by this process wake its dispatchers at once if anyone subscribed;
        /// other processes' dispatchers poll.
        let probe = ActiveSubscriptionProbe(pool: pool)
        let eventsWritten: @Sendable () -> Void = {
            if let dispatcher, probe.anyActive() { dispatcher.wake() }
        }

        var router = Router()
        OperationsRoutes.register(
            on: &router, database: database, metrics: metrics, health: health, servesMetrics: configuration.metricsListen == nil)
        if configuration.roles.contains(.api) {
            let login = LoginService(
                validator: validator, apple: apple, pool: pool, tokenKeys: tokenKeys, teamID: appleSettings.teamID,
                settings: configuration.login, validationIntervalSeconds: configuration.sweep.validationIntervalSeconds,
                retry: retry, metrics: metrics, groups: appleSettings.appGroups, redirectURIs: appleSettings.redirectURIs,
                eventsWritten: eventsWritten)
            LoginRoutes.register(
                on: &router, login: login, users: UserDirectory(pool: pool, groups: appleSettings.appGroups), keys: apiKeys)
            EventRoutes.register(
                on: &router, subscriptions: subscriptions, feed: EventFeed(pool: pool), keys: apiKeys,
                wakeDispatcher: eventsWritten)
            DeletionRoutes.register(
                on: &router,
                service: DeletionService(
                    store: deletionStore, wake: wakeDeletions,
                    codes: .init(
                        tokenKeys: tokenKeys, clientIDs: Set(appleSettings.clientIDs), redirectURIs: appleSettings.redirectURIs,
                        webCallbackURL: configuration.web?.callbackURL)),
                keys: apiKeys)
            WebSignInRoutes.register(
                on: &router,
                service: WebSignInService(
                    settings: configuration.web, appleBaseURL: appleSettings.baseURL, store: WebSignInStore(pool: pool),
                    login: login, keys: tokenKeys, metrics: metrics),
                keys: apiKeys,
                perAddress: RateLimiter(
                    rate: configuration.rateLimitNotificationsPerAddress, burst: configuration.rateLimitNotificationsPerAddress * 5))
        }
        if configuration.roles.contains(.notifications) {
            let receiver = NotificationReceiver(
                verifier: verifier, clientIDs: Set(appleSettings.clientIDs), groups: appleSettings.appGroups,
                teamID: appleSettings.teamID, hasher: SubjectHasher(keys: tokenKeys),
                leeway: TimeInterval(configuration.login.tokenLeewaySeconds),
                retentionSeconds: configuration.dispatch.notificationRetentionSeconds, pool: pool, metrics: metrics,
                logger: logger.labelled("notifications"), onDeletionRequested: wakeDeletions, eventsWritten: eventsWritten)
            let perAddress = RateLimiter(
                rate: configuration.rateLimitNotificationsPerAddress, burst: configuration.rateLimitNotificationsPerAddress * 5)
            NotificationRoutes.register(
                on: &router, path: configuration.notificationsPath, receiver: receiver, perAddress: perAddress)
        }

        var workers: [WorkerGroup] = []
        if let deletionWorker {
            workers.append(deletionWorker)
            listener.subscribe("deletion_requested") { _ in deletionWorker.wake() }
        }
        if let dispatcher {
            workers.append(dispatcher)
            workers.append(
                WorkerGroup(name: "webhook-reconcile", lanes: 1, interval: .seconds(60), logger: logger) {
                    try WebhookSubscriptionStore.reconcileParkedDeliveries(pool)
                    return false
                })
        }
        if configuration.roles.contains(.sweep) {
            let sweep = RefreshTokenSweep(
                pool: pool, apple: apple, tokenKeys: tokenKeys, settings: configuration.sweep,
                groups: appleSettings.appGroups, teamID: appleSettings.teamID, metrics: metrics,
                logger: logger.labelled("refresh-sweep"))
            workers.append(
                WorkerGroup(
                    name: "refresh-sweep", lanes: configuration.sweep.concurrency,
                    interval: .seconds(configuration.sweep.intervalSeconds), logger: logger, step: sweep.step))
            let retentionSeconds = configuration.dispatch.retentionSeconds
            let notificationRetentionSeconds = configuration.dispatch.notificationRetentionSeconds
            workers.append(
                WorkerGroup(name: "housekeeping", lanes: 1, interval: .seconds(300), logger: logger) {
                    // Authorization codes live five minutes; their exchange ledger one hour.
                    try pool.query("DELETE FROM authorization_codes WHERE created_at < now() - interval '1 hour'")
                    try EventRetention.prune(pool, retentionSeconds: retentionSeconds)
                    try WebSignInStore.prune(pool)
                    try NotificationReceiver.prune(pool, retentionSeconds: notificationRetentionSeconds)
                    return false
                })
        }
        self.workers = workers

        routes = router.routes.map { "\($0.method) \($0.pattern)" }
        var serverConfiguration = HTTPServer.Configuration()
        serverConfiguration.listen = configuration.listen
        serverConfiguration.workerThreads = configuration.httpThreads
        serverConfiguration.maximumBodyBytes = configuration.maximumBodyBytes
        serverConfiguration.connectionTimeoutSeconds = configuration.connectionTimeoutSeconds
        serverConfiguration.connectionsPerAddress = configuration.connectionsPerAddress
        serverConfiguration.headerTimeoutSeconds = configuration.headerTimeoutSeconds
        serverConfiguration.shutdownGracePeriod = .seconds(configuration.shutdownGraceSeconds)
        serverConfiguration.accessLog = configuration.accessLog
        serverConfiguration.tls = configuration.tls.map { (keyPEM: $0.keyPEM, certificatePEM: $0.certificatePEM) }
        server = HTTPServer(
            configuration: serverConfiguration, router: router, logger: logger.labelled("http"), metrics: metrics,
            errorMapper: ProblemCatalog.problem(for:))
        if let metricsListen = configuration.metricsListen {
            var metricsRouter = Router()
            OperationsRoutes.registerMetrics(on: &metricsRouter, metrics: metrics)
            var metricsConfiguration = HTTPServer.Configuration()
            metricsConfiguration.listen = metricsListen
            metricsConfiguration.workerThreads = 2
            metricsConfiguration.connectionLimit = 64
            metricsConfiguration.accessLog = false
            // Its own registry: scrapes are not counted among the API's requests.
            metricsServer = HTTPServer(
                configuration: metricsConfiguration, router: metricsRouter, logger: logger.labelled("metrics"),
                metrics: MetricsRegistry())
        } else {
            metricsServer = nil
        }
        registerPoolMetrics()
        ProcessMetrics.register(on: metrics)
        let commit = EmbeddedFiles.text(named: "build-commit") ?? "unknown"
        metrics.collect {
            [CollectedSample(
                name: "appleid_broker_build_info", help: "The running build: version and commit (always 1).",
                labels: [("version", BrokerCommand.version), ("commit", commit)], value: 1)]
        }
        let apiKeys = self.apiKeys
        listener.subscribe(APIKeyStore.changedChannel) { _ in apiKeys.invalidate() }
    }

    /// Starts the listener, the workers and the HTTP server.
    public func start() throws {
        listener.start()
        if configuration.roles.contains(.api) || configuration.roles.contains(.notifications) {
            appleKeys.start()
        }
        workers.forEach { $0.start() }
        try metricsServer?.start()
        try server.start()
        logger.notice(
            "appleid-broker started",
            [("port", String(server.port)), ("roles", configuration.roles.sorted().map(\.rawValue).joined(separator: ","))])
    }

    /// The bound HTTP port.
    public var port: UInt16 { server.port }

    /// The metrics listener's port, when there is one.
    public var metricsPort: UInt16? { metricsServer?.port }

    /// Graceful stop, in reverse order of start.
    public func stop() {
        health.beginShutdown()
        server.shutdown()
        metricsServer?.shutdown()
        workers.forEach { $0.stop() }
        appleKeys.stop()
        listener.stop()
        database.close()
        logger.notice("appleid-broker stopped")
    }

    private func registerPoolMetrics() {
        let pool = database.pool
        metrics.collect {
            let statistics = pool.statistics
            let help = "Database connection pool: open, idle, waiting callers and the maximum."
            return [
                CollectedSample(name: "db_pool_connections", help: help, labels: [("state", "open")], value: Double(statistics.open)),
                CollectedSample(name: "db_pool_connections", help: help, labels: [("state", "idle")], value: Double(statistics.idle)),
                CollectedSample(name: "db_pool_connections", help: help, labels: [("state", "waiting")], value: Double(statistics.waiting)),
                CollectedSample(name: "db_pool_connections", help: help, labels: [("state", "max")], value: Double(statistics.maximum)),
            ]
        }
    }
}
