import EmbeddedPostgres
import Foundation
import Glibc
import PostgresClient
import ProcessRunner

/// Debian's PgBouncer (`apt-get install pgbouncer`) in front of the test cluster, in
/// transaction pooling with its defaults otherwise (no `ignore_startup_parameters`), on a
/// loopback port of its own. Stopped in deinit.
public final class TestPgBouncer: Sendable {
    public static let binary = "/usr/sbin/pgbouncer"
    public static var isInstalled: Bool { FileManager.default.isExecutableFile(atPath: binary) }

    public let port: Int
    public let directory: String
    private let process: ChildProcess

    /// Starts PgBouncer for the database `database` (a fresh test database) points at.
    public init(database: PostgresConfiguration, poolSize: Int = 4) throws {
        let cluster = try TestPostgres.cluster()
        port = FreePort.next()
        directory = "/tmp/abk-pgbouncer-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let user = cluster.configuration.superuser
        try """
        [databases]
        * = host=\(cluster.socketDirectory) port=5432 user=\(user)

        [pgbouncer]
        listen_addr = 127.0.0.1
        listen_port = \(port)
        unix_socket_dir =
        auth_type = trust
        auth_file = \(directory)/users.txt
        admin_users = \(user)
        pool_mode = transaction
        default_pool_size = \(poolSize)
        max_client_conn = 200
        logfile = \(directory)/pgbouncer.log
        pidfile = \(directory)/pgbouncer.pid

        """.write(toFile: directory + "/pgbouncer.ini", atomically: true, encoding: .utf8)
        try "\"\(user)\" \"\"\n".write(toFile: directory + "/users.txt", atomically: true, encoding: .utf8)
        // PgBouncer refuses to run as root: then it runs as the cluster's account.
        let command = [Self.binary, directory + "/pgbouncer.ini"]
        if geteuid() == 0 {
            let account = cluster.configuration.systemUser
            guard let entry = getpwnam(account) else { throw Failure("no account \(account)") }
            for path in [directory, directory + "/pgbouncer.ini", directory + "/users.txt"] {
                chown(path, entry.pointee.pw_uid, entry.pointee.pw_gid)
            }
            process = try ChildProcess.start("/usr/sbin/runuser", ["-u", account, "--"] + command, output: .file("/dev/null"))
        } else {
            process = try ChildProcess.start(command[0], Array(command.dropFirst()), output: .file("/dev/null"))
        }
        // Ready when the admin console answers.
        for _ in 0..<200 {
            if (try? PostgresConnection(configuration: try admin())) != nil { return }
            Thread.sleep(forTimeInterval: 0.05)
        }
        process.send(SIGKILL, toGroup: true)
        throw Failure("PgBouncer did not start: \(log)")
    }

    deinit {
        process.send(SIGTERM, toGroup: true)
        _ = process.wait()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// `DATABASE_URL` for `database` through PgBouncer.
    public func url(for database: PostgresConfiguration) throws -> String {
        let name = try PostgresConnection(configuration: database).query("SELECT current_database() AS name").single()
            .decode(String.self, "name")
        return "postgres://\(try TestPostgres.cluster().configuration.superuser)@127.0.0.1:\(port)/\(name)"
    }

    /// The admin console (`SHOW STATS`, `SHOW POOLS`), simple-query protocol only.
    public func admin() throws -> PostgresConfiguration {
        try PostgresConfiguration(
            connectionString: "postgres://\(try TestPostgres.cluster().configuration.superuser)@127.0.0.1:\(port)/pgbouncer")
    }

    /// Transactions PgBouncer routed for a database (`SHOW STATS`, `total_xact_count`).
    public func transactions(database name: String) throws -> Int {
        let rows = try PostgresConnection(configuration: try admin()).execute("SHOW STATS")
        return try rows.first { (try? $0.decode(String.self, "database")) == name }?.decode(Int.self, "total_xact_count") ?? 0
    }

    public var log: String { (try? String(contentsOfFile: directory + "/pgbouncer.log", encoding: .utf8)) ?? "" }

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
        init(_ description: String) { self.description = description }
    }
}
