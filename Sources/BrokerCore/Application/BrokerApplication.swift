import Foundation
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

    /// Opens the database (migrating it) and builds every component; starts nothing.
    public init(configuration: BrokerConfiguration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        database = try Database.open(configuration, logger: logger)
        metrics = MetricsRegistry()
        apiKeys = APIKeyAuthenticator(store: APIKeyStore(pool: database.pool))
        listener = PostgresListener(configuration: database.connection, logger: logger.labelled("listener"))

        var router = Router()
        OperationsRoutes.register(on: &router, database: database, metrics: metrics, health: health)

        var serverConfiguration = HTTPServer.Configuration()
        serverConfiguration.listen = configuration.listen
        serverConfiguration.workerThreads = configuration.httpThreads
        serverConfiguration.maximumBodyBytes = configuration.maximumBodyBytes
        serverConfiguration.connectionTimeoutSeconds = configuration.connectionTimeoutSeconds
        serverConfiguration.shutdownGracePeriod = .seconds(configuration.shutdownGraceSeconds)
        serverConfiguration.accessLog = configuration.accessLog
        server = HTTPServer(
            configuration: serverConfiguration, router: router, logger: logger.labelled("http"), metrics: metrics,
            errorMapper: ErrorMapping.problem(for:))
        registerPoolMetrics()
        let apiKeys = self.apiKeys
        listener.subscribe(APIKeyStore.changedChannel) { _ in apiKeys.invalidate() }
    }

    /// Starts the listener, the workers and the HTTP server.
    public func start() throws {
        listener.start()
        try server.start()
        logger.notice(
            "appleid-broker started",
            [("port", String(server.port)), ("roles", configuration.roles.sorted().map(\.rawValue).joined(separator: ","))])
    }

    /// The bound HTTP port.
    public var port: UInt16 { server.port }

    /// Graceful stop, in reverse order of start.
    public func stop() {
        health.beginShutdown()
        server.shutdown()
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
