import BrokerCore
import EmbeddedPostgres
import Foundation
import Locking
import Observability
import PostgresClient
import Synchronization

/// Throwaway PostgreSQL for tests: one cluster per test process, started on first use in a
/// temporary directory and stopped and removed when the process exits, and a fresh database
/// per test (a copy of a migrated template) so tests running in parallel never see each other's rows.
public enum TestPostgres {
    private static let clusters = Lock<[EmbeddedPostgres]>([])

    private static let shared: Result<EmbeddedPostgres, any Error> = Result {
        let cluster = try makeCluster(name: "shared")
        try cluster.start()
        return cluster
    }

    /// The process-wide cluster.
    public static func cluster() throws -> EmbeddedPostgres { try shared.get() }

    /// A new database in the shared cluster, migrated to this release: a copy (`CREATE DATABASE
    /// … TEMPLATE`) of a template database migrated once per test process, so a test does not
    /// run every migration again. `Migrations.apply` on it finds nothing pending.
    public static func freshDatabase() throws -> PostgresConfiguration {
        try database(template: try migratedTemplate.get())
    }

    /// A new, empty database in the shared cluster (no schema, no `schema_migrations`): for
    /// tests of the migrations themselves.
    public static func emptyDatabase() throws -> PostgresConfiguration {
        try database(template: nil)
    }

    private static let migratedTemplate: Result<String, any Error> = Result {
        let name = "abk_template"
        let configuration = try database(named: name, template: nil)
        try Migrations.apply(configuration: configuration, logger: Logger(label: "test-postgres", sink: LogSink(level: .warning)))
        return name
    }

    private static func database(template: String?) throws -> PostgresConfiguration {
        try database(
            named: "t_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased().prefix(16), template: template)
    }

    /// CREATE DATABASE waits (up to 5 s) for the template's last session, the migration's, to end.
    private static func database(named name: String, template: String?) throws -> PostgresConfiguration {
        let cluster = try cluster()
        let admin = try PostgresConnection(configuration: cluster.connectionConfiguration)
        try admin.execute("CREATE DATABASE \(name)" + (template.map { " TEMPLATE \($0)" } ?? ""))
        return try PostgresConfiguration(
            connectionString: cluster.connectionConfiguration.connectionString.replacingOccurrences(
                of: "dbname='postgres'", with: "dbname='\(name)'"))
    }

    /// A cluster of its own, for a test that stops or restarts the server.
    /// It is started; it is stopped and removed at process exit if the test did not.
    public static func dedicatedCluster() throws -> EmbeddedPostgres {
        let cluster = try makeCluster(name: "dedicated")
        try cluster.start()
        return cluster
    }

    /// Clusters left behind by test processes that died without running their `atexit`
    /// (a crash, a kill): stopped and removed once, before this process makes its own.
    private static let orphansReaped: Void = {
        let temporary = NSTemporaryDirectory()
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: temporary)) ?? [] where entry.hasPrefix("abk-test-") {
            guard let pid = Int32(entry.split(separator: "-")[2]), pid != getpid(), kill(pid, 0) != 0, errno == ESRCH
            else { continue }
            let directory = temporary + entry
            if let cluster = try? EmbeddedPostgres(
                configuration: EmbeddedPostgres.Configuration(dataDirectory: directory + "/data"),
                logger: Logger(label: "test-postgres", sink: LogSink(level: .error)))
            {
                try? cluster.stop()
                try? FileManager.default.removeItem(atPath: cluster.socketDirectory)
            }
            try? FileManager.default.removeItem(atPath: directory)
        }
    }()

    private static func makeCluster(name: String) throws -> EmbeddedPostgres {
        _ = orphansReaped
        let directory = NSTemporaryDirectory() + "abk-test-\(getpid())-\(name)-\(UUID().uuidString.prefix(8))"
        var configuration = EmbeddedPostgres.Configuration(dataDirectory: directory + "/data")
        configuration.durable = false
        configuration.settings = ["max_connections": "400"]
        let cluster = try EmbeddedPostgres(
            configuration: configuration, logger: Logger(label: "test-postgres", sink: LogSink(level: .warning)))
        let first = clusters.withLock { list -> Bool in
            list.append(cluster)
            return list.count == 1
        }
        if first { atexit { TestPostgres.stopAll() } }
        return cluster
    }

    private static func stopAll() {
        for cluster in clusters.withLock({ $0 }) {
            try? cluster.stop()
            let data = cluster.configuration.dataDirectory
            try? FileManager.default.removeItem(atPath: (data as NSString).deletingLastPathComponent)
            try? FileManager.default.removeItem(atPath: cluster.socketDirectory)
        }
    }
}
