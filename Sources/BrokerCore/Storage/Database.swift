import EmbeddedPostgres
import Foundation
import Observability
import PostgresClient

/// The service's PostgreSQL: the server at `DATABASE_URL`, or an embedded cluster in
/// `BROKER_DATA_DIR/postgres` when that is unset. Opening it applies pending migrations.
public final class Database: Sendable {
    public let connection: PostgresConfiguration
    /// Where the notification listener connects: `DATABASE_LISTEN_URL`, or `connection`.
    /// LISTEN belongs to a session, which PgBouncer in transaction pooling does not keep.
    public let listenConnection: PostgresConfiguration
    public let pool: PostgresPool
    private let embedded: EmbeddedPostgres?
    private let logger: Logger

    private init(
        connection: PostgresConfiguration, listenConnection: PostgresConfiguration, pool: PostgresPool,
        embedded: EmbeddedPostgres?, logger: Logger
    ) {
        self.connection = connection
        self.listenConnection = listenConnection
        self.pool = pool
        self.embedded = embedded
        self.logger = logger
    }

    /// Connects (starting the embedded cluster if needed), migrates, and opens the pool.
    /// - Parameter waitForServer: how long to keep retrying while the server is unreachable.
    public static func open(
        _ configuration: BrokerConfiguration, logger: Logger, waitForServer: Duration = .seconds(60)
    ) throws -> Database {
        var embedded: EmbeddedPostgres?
        var started = false
        var connection: PostgresConfiguration
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
        connection.applicationName = Self.applicationName
        var listenConnection = connection
        if let url = configuration.databaseListenURL {
            listenConnection = try PostgresConfiguration(connectionString: url)
            listenConnection.applicationName = Self.applicationName
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
        poolConfiguration.acquireTimeout = configuration.databaseAcquireTimeout
        let pool = PostgresPool(configuration: poolConfiguration, logger: logger.labelled("postgres"))
        return Database(
            connection: connection, listenConnection: listenConnection, pool: pool, embedded: embedded, logger: logger)
    }

    /// `application_name` of every connection of this process: its pid, so that `close()`
    /// can tell its own backends from other processes' (and operators see who is connected).
    static let applicationName = "appleid-broker[\(getpid())]"

    /// Closes the pool and stops the embedded cluster unless another process (a CLI command,
    /// a second broker) is still connected to it: whoever uses the cluster last stops it,
    /// whether or not it started it.
    ///
    /// Call after everything else holding a connection (listener, workers, server) has
    /// stopped. A backend leaves `pg_stat_activity` a moment after its client disconnects,
    /// so this waits (up to 3 s) for this process's own backends to end, and counts only
    /// those of other processes: counting right away saw our own closing connections as
    /// "other clients" and left the cluster running.
    /// One round trip (`/readyz`): throws the pool's error when PostgreSQL cannot answer.
    public func ping() throws {
        try pool.query("SELECT 1")
    }

    public func close() {
        pool.close()
        guard let embedded, embedded.isRunning() else { return }
        var probeConfiguration = connection
        probeConfiguration.applicationName = "appleid-broker shutdown check"
        guard let probe = try? PostgresConnection(configuration: probeConfiguration) else { return }
        let ours = Self.applicationName
        func count(_ mine: Bool) -> Int {
            (try? probe.query(
                """
                SELECT count(*) AS connections FROM pg_stat_activity
                WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                  AND (application_name = \(ours)) = \(mine)
                """
            ).single().decode(Int.self, "connections")) ?? 0
        }
        let deadline = ContinuousClock.now + .seconds(3)
        while count(true) > 0 && ContinuousClock.now < deadline {
            Thread.sleep(forTimeInterval: 0.02)
        }
        let others = count(false)
        withExtendedLifetime(probe) {}
        if others > 0 {
            logger.notice("leaving the embedded PostgreSQL running: other clients are connected", [("clients", String(others))])
            return
        }
        do { try embedded.stop() } catch { logger.error("stopping embedded PostgreSQL failed", [("error", "\(error)")]) }
    }
}
