import EmbeddedPostgres
import Foundation
import Observability
import PostgresClient

/// The service's PostgreSQL: the server at `DATABASE_URL`, or an embedded cluster in
/// `BROKER_DATA_DIR/postgres` when that is unset. Opening it applies pending migrations.
public final class Database: Sendable {
    public let connection: PostgresConfiguration
    public let pool: PostgresPool
    private let embedded: EmbeddedPostgres?
    private let startedEmbedded: Bool
    private let logger: Logger

    private init(
        connection: PostgresConfiguration, pool: PostgresPool, embedded: EmbeddedPostgres?, startedEmbedded: Bool,
        logger: Logger
    ) {
        self.connection = connection
        self.pool = pool
        self.embedded = embedded
        self.startedEmbedded = startedEmbedded
        self.logger = logger
    }

    /// Connects (starting the embedded cluster if needed), migrates, and opens the pool.
    /// - Parameter waitForServer: how long to keep retrying while the server is unreachable.
    public static func open(
        _ configuration: BrokerConfiguration, logger: Logger, waitForServer: Duration = .seconds(60)
    ) throws -> Database {
        var embedded: EmbeddedPostgres?
        var started = false
        let connection: PostgresConfiguration
        if let url = configuration.databaseURL {
            connection = try PostgresConfiguration(connectionString: url)
        } else {
            let cluster = try EmbeddedPostgres(
                configuration: .init(dataDirectory: configuration.dataDirectory + "/postgres"),
                logger: logger.labelled("embedded-postgres"))
            started = try cluster.start()
            embedded = cluster
            connection = cluster.connectionConfiguration
        }
        do {
            let deadline = ContinuousClock.now + waitForServer
            while true {
                do {
                    try Migrations.apply(configuration: connection, logger: logger.labelled("migrations"))
                    break
                } catch let error as PostgresError where error.isUnavailable && ContinuousClock.now < deadline {
                    logger.warning("database unreachable; retrying", [("error", "\(error)")])
                    Thread.sleep(forTimeInterval: 1)
                }
            }
        } catch {
            if started { try? embedded?.stop() }
            throw error
        }
        var poolConfiguration = PostgresPool.Configuration(
            connection: connection, maximumConnections: configuration.databasePoolSize)
        poolConfiguration.acquireTimeout = .milliseconds(configuration.databaseAcquireTimeoutMilliseconds)
        let pool = PostgresPool(configuration: poolConfiguration, logger: logger.labelled("postgres"))
        return Database(
            connection: connection, pool: pool, embedded: embedded, startedEmbedded: started, logger: logger)
    }

    /// Closes the pool and stops the embedded cluster if this process started it and no
    /// other process (a CLI command, a second broker) is still connected to it.
    public func close() {
        pool.close()
        guard startedEmbedded, let embedded else { return }
        let others = (try? PostgresConnection(configuration: connection).query(
            """
            SELECT count(*) FROM pg_stat_activity
            WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
            """
        ).single().decode(Int.self, 0)) ?? 0
        if others > 0 {
            logger.notice("leaving the embedded PostgreSQL running: other clients are connected", [("clients", String(others))])
            return
        }
        do { try embedded.stop() } catch { logger.error("stopping embedded PostgreSQL failed", [("error", "\(error)")]) }
    }
}
