import AppleID
import BrokerCore
import Console
import Foundation
import HTTPClient
import HTTPServer
import Observability
import OpenIDProvider
import PostgresClient
import Workers

/// The running service: database, HTTP API and background workers, assembled from a
/// configuration and started and stopped as one.
///
/// `start()` returns once everything listens; `stop()` stops accepting requests, waits
/// for in-flight ones, stops workers, closes the pool and, if it started one, the
/// embedded PostgreSQL.
public final class BrokerApplication: Sendable {
    /// This build's version (`appleid-broker --version`, `appleid_broker_build_info`).
    public static let version = "0.1.0"

    /// Problem `type` URIs: this followed by the code (`urn:appleid-broker:problem:user_not_found`).
    public static let problemTypeBase = "urn:appleid-broker:problem:"

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
    /// The operators' console, when `BROKER_CONSOLE_LISTEN` is set (docs/console.md).
    public let console: ConsoleServer?
    /// Apple's signing keys, shared by login and notifications.
    public let appleKeys: AppleKeyCache
    public let apple: AppleClient
    let workers: [WorkerGroup]
    /// Every route this process serves, as `METHOD /pattern` (for the API description's test).
    public let routes: [String]

    /// What runs, in start order; `stop()` goes through it backwards.
    private let lifecycle: [Lifecycle]

    /// Opens the database (migrating it) and builds every component; starts nothing.
    /// - Parameters:
    ///   - transport: how to reach Apple (the seam tests may replace).
    ///   - console: the console's settings (`ConsoleConfiguration.load`); nil: no console.
    public init(
        configuration: BrokerConfiguration, console consoleSettings: ConsoleConfiguration? = nil, logger: Logger,
        transport: any HTTPTransport = CurlTransport()
    ) throws {
        guard let appleSettings = configuration.apple, let tokenKeys = configuration.tokenKeys else {
            throw BrokerConfiguration.Invalid(problems: ["serve needs the Apple settings and TOKEN_ENCRYPTION_KEY"])
        }
        var serverConfiguration = try Self.serverConfiguration(configuration)
        self.configuration = configuration
        self.logger = logger
        database = try Database.open(configuration, logger: logger)
        try GrantAlignment.align(database.pool, groups: appleSettings.appGroups)
        let metrics = MetricsRegistry()
        self.metrics = metrics
        listener = PostgresListener(configuration: database.listenConnection, logger: logger.labelled("listener"))
        let parts = BrokerParts(
            configuration: configuration, apple: appleSettings, tokenKeys: tokenKeys, pool: database.pool, metrics: metrics,
            logger: logger, transport: transport)
        apiKeys = parts.apiKeys
        apple = parts.apple
        appleKeys = parts.appleKeys

        // Each role adds its workers and routes; the deletion job and the dispatcher come
        // first, since routes and notifications wake them.
        let roles = configuration.roles
        let deletionWorker = roles.contains(.deletion) ? parts.deletionWorker() : nil
        let dispatcher = roles.contains(.dispatch) ? parts.dispatcher() : nil
        let wakeDeletions: @Sendable () -> Void = { deletionWorker?.wake() }
        // Events written by this process wake its dispatchers at once if anyone subscribed;
        // other processes' dispatchers poll.
        let probe = ActiveSubscriptionProbe(pool: database.pool)
        let eventsWritten: @Sendable () -> Void = {
            if let dispatcher, probe.anyActive() { dispatcher.wake() }
        }
        var router = Router()
        OperationsRoutes.register(
            on: &router, database: database, metrics: metrics, health: health, servesMetrics: configuration.metricsListen == nil)
        if roles.contains(.api),
            let refusals = try parts.registerAPI(on: &router, wakeDeletions: wakeDeletions, eventsWritten: eventsWritten)
        {
            // The OpenID Provider's endpoints answer the server's own refusals (a body over the
            // limit) in their RFCs' formats; every other refusal stays a problem document.
            serverConfiguration.problemRenderer = { problem, request in
                refusals(problem, request)
                    ?? problem.response(instance: request.path, requestID: request.requestID, typeBase: Self.problemTypeBase)
            }
        }
        if roles.contains(.notifications) {
            parts.registerNotifications(on: &router, wakeDeletions: wakeDeletions, eventsWritten: eventsWritten)
        }
        var workers: [WorkerGroup] = []
        if let deletionWorker {
            workers.append(deletionWorker)
            listener.subscribe("deletion_requested") { _ in deletionWorker.wake() }
        }
        if let dispatcher { workers += [dispatcher, parts.webhookReconciler()] }
        if roles.contains(.dispatch), let logout = parts.logoutDispatcher() {
            workers.append(logout.group)
            if let channel = logout.wakeChannel { listener.subscribe(channel) { _ in logout.group.wake() } }
        }
        if roles.contains(.sweep) { workers += [parts.refreshSweep(), parts.housekeeping()] }
        self.workers = workers

        routes = router.routes.map { "\($0.method) \($0.pattern)" }
        server = HTTPServer(
            configuration: serverConfiguration, router: router, logger: logger.labelled("http"),
            metrics: metrics, errorMapper: ProblemCatalog.problem(for:))
        metricsServer = configuration.metricsListen.map { Self.metricsServer(listen: $0, metrics: metrics, logger: logger) }
        let pool = database.pool
        let console = consoleSettings.map { settings in
            ConsoleServer(
                configuration: settings, pool: pool,
                deletions: DeletionService(store: parts.deletionStore, wake: wakeDeletions),
                subscriptions: parts.subscriptions, teamID: appleSettings.teamID, hasher: SubjectHasher(keys: tokenKeys),
                apps: appleSettings.appGroups, clientIDs: appleSettings.clientIDs,
                keySetAge: { [appleKeys = parts.appleKeys] in appleKeys.age }, metrics: metrics,
                trustedProxies: serverConfiguration.trustedProxies, logger: logger,
                logoutQueue: LogoutDeliveryStore(pool: pool).queue)
        }
        self.console = console
        ProcessMetrics.register(on: metrics)
        let commit = BuildResources.commit
        metrics.collect {
            [
                CollectedSample(
                    name: "appleid_broker_build_info", help: "The running build: version and commit (always 1).",
                    labels: [("version", Self.version), ("commit", commit)], value: 1)
            ]
        }
        let apiKeys = self.apiKeys
        listener.subscribe(APIKeyStore.changedChannel) { _ in apiKeys.invalidate() }

        // Start in this order, stop in the reverse: requests stop first, the database last.
        let (listener, appleKeys, server, metricsServer) = (listener, appleKeys, server, metricsServer)
        var lifecycle: [Lifecycle] = [Lifecycle("listener", start: listener.start, stop: listener.stop)]
        if roles.contains(.api) || roles.contains(.notifications) {
            lifecycle.append(Lifecycle("apple-keys", start: appleKeys.start, stop: appleKeys.stop))
        }
        lifecycle += workers.map { worker in Lifecycle("workers", start: worker.start, stop: worker.stop) }
        if let metricsServer { lifecycle.append(Lifecycle("metrics", start: metricsServer.start, stop: metricsServer.shutdown)) }
        if let console { lifecycle.append(Lifecycle("console", start: console.start, stop: console.shutdown)) }
        lifecycle.append(Lifecycle("http", start: server.start, stop: server.shutdown))
        self.lifecycle = lifecycle
        registerPoolMetrics()
    }

    /// Starts everything in order; returns once the HTTP server listens. When a part fails
    /// (its port taken, say), the parts already started stop in reverse and the database
    /// closes (stopping an embedded cluster nobody else uses) before the error is rethrown.
    public func start() throws {
        for (index, part) in lifecycle.enumerated() {
            do {
                try part.start()
            } catch {
                logger.error("could not start", [("part", part.name), ("error", "\(error)")])
                for started in lifecycle[..<index].reversed() { started.stop() }
                database.close()
                throw error
            }
        }
        logger.notice(
            "appleid-broker started",
            [("port", String(server.port)), ("roles", configuration.roles.sorted().map(\.rawValue).joined(separator: ","))])
    }

    /// The bound HTTP port.
    public var port: UInt16 { server.port }

    /// The metrics listener's port, when there is one.
    public var metricsPort: UInt16? { metricsServer?.port }

    /// Graceful stop, in reverse order of start: no new requests, in-flight ones finished,
    /// workers stopped, then the pool and (if this process started it) the embedded PostgreSQL.
    public func stop() {
        health.beginShutdown()
        for part in lifecycle.reversed() { part.stop() }
        database.close()
        logger.notice("appleid-broker stopped")
    }

    private static func serverConfiguration(_ configuration: BrokerConfiguration) throws -> HTTPServer.Configuration {
        var server = HTTPServer.Configuration()
        server.trustedProxies = try configuration.trustedProxies.map { text in
            guard let range = ClientAddress.Range(text) else {
                throw BrokerConfiguration.Invalid(problems: [
                    "BROKER_TRUSTED_PROXIES: expected CIDRs such as 10.0.0.0/8 or fd00::/8, got '\(text)'"
                ])
            }
            return range
        }
        server.listen = configuration.listen
        server.workerThreads = configuration.httpThreads
        server.maximumBodyBytes = configuration.maximumBodyBytes
        server.connectionTimeoutSeconds = Int(configuration.connectionTimeout.components.seconds)
        server.connectionsPerAddress = configuration.connectionsPerAddress
        server.headerTimeoutSeconds = Int(configuration.headerTimeout.components.seconds)
        server.shutdownGracePeriod = configuration.shutdownGrace
        server.accessLog = configuration.accessLog
        server.problemTypeBase = problemTypeBase
        server.tls = configuration.tls.map { (keyPEM: $0.keyPEM, certificatePEM: $0.certificatePEM) }
        return server
    }

    /// `/metrics` alone on `BROKER_METRICS_LISTEN`, with its own registry: scrapes are not
    /// counted among the API's requests.
    private static func metricsServer(listen: String, metrics: MetricsRegistry, logger: Logger) -> HTTPServer {
        var router = Router()
        OperationsRoutes.registerMetrics(on: &router, metrics: metrics)
        var configuration = HTTPServer.Configuration()
        configuration.listen = listen
        configuration.workerThreads = 2
        configuration.connectionLimit = 64
        configuration.accessLog = false
        return HTTPServer(
            configuration: configuration, router: router, logger: logger.labelled("metrics"), metrics: MetricsRegistry())
    }

    private func registerPoolMetrics() {
        let pool = database.pool
        metrics.collect {
            let statistics = pool.statistics
            let help = "Database connection pool: open, idle, waiting callers and the maximum."
            return [
                CollectedSample(
                    name: "db_pool_connections", help: help, labels: [("state", "open")], value: Double(statistics.open)),
                CollectedSample(
                    name: "db_pool_connections", help: help, labels: [("state", "idle")], value: Double(statistics.idle)),
                CollectedSample(
                    name: "db_pool_connections", help: help, labels: [("state", "waiting")], value: Double(statistics.waiting)),
                CollectedSample(
                    name: "db_pool_connections", help: help, labels: [("state", "max")], value: Double(statistics.maximum)),
                CollectedSample(
                    name: "db_statements_total", help: "Statements (round trips) run on the pool's connections.",
                    type: .counter, value: Double(statistics.statements)),
                CollectedSample(
                    name: "db_pool_waits_total", help: "Acquisitions that waited for a free connection.", type: .counter,
                    value: Double(statistics.waits)),
                CollectedSample(
                    name: "db_pool_wait_seconds_total", help: "Time callers waited for a free connection.", type: .counter,
                    value: statistics.waitSeconds),
                CollectedSample(
                    name: "db_pipelined_reads_total",
                    help: "Read-only statements sent through the read pipeline (part of db_statements_total).",
                    type: .counter, value: Double(statistics.pipelinedReads)),
                CollectedSample(
                    name: "db_pipeline_batches_total",
                    help: "Round trips of the read pipeline: under load several statements share one.", type: .counter,
                    value: Double(statistics.pipelineBatches)),
            ]
        }
    }
}
