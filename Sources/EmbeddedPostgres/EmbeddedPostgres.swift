import Foundation
import Glibc
import Locking
import Observability
import PostgresClient
import ProcessRunner

/// A private PostgreSQL cluster in a data directory, reachable only through a Unix socket
/// owned by the service: what `appleid-broker serve` uses when `DATABASE_URL` is unset,
/// and what the tests start for themselves.
///
/// `initdb` and `postgres` refuse to run as root. When this process is root they run as
/// an unprivileged account (`postgres`, created by Debian's `postgresql` package, unless
/// `Configuration.systemUser` says otherwise) through `runuser`, and the data directory
/// is handed to that account.
///
/// The cluster never outlives the last process using it, however that process ends
/// (SIGKILL included). Every process that starts or joins it holds a shared `flock` on
/// `<dataDirectory>.users.lock` until it exits, and whoever starts the server also starts a
/// watchdog, `flock --exclusive <that file> pg_ctl stop`, in a session of its own: the
/// kernel drops a dead process's locks, so the watchdog's exclusive lock is granted the
/// moment the last user is gone, and it stops the server. A death signal on the server
/// (`setpriv --pdeathsig`) cannot do this: pg_ctl daemonizes the postmaster, whose parent
/// is then init, and the server must stay up while any other process (a second broker, a
/// CLI command) still uses it.
public final class EmbeddedPostgres: Sendable {
    public struct Configuration: Sendable {
        /// The cluster's data directory (created if missing).
        public var dataDirectory: String
        /// Where the server binaries are; nil finds them (`POSTGRES_BIN_DIR`, `pg_config --bindir`,
        /// `/usr/lib/postgresql/*/bin`).
        public var binaryDirectory: String?
        /// The account the server runs as when this process is root.
        public var systemUser: String = "postgres"
        /// The database superuser created by `initdb`.
        public var superuser: String = "broker"
        /// Database to connect to.
        public var database: String = "postgres"
        /// false turns off fsync and synchronous commit: for throwaway test clusters only.
        public var durable: Bool = true
        /// Extra `-c name=value` server settings.
        public var settings: [String: String] = [:]

        public init(dataDirectory: String) {
            self.dataDirectory = dataDirectory
        }
    }

    /// Why the embedded cluster could not be used.
    public struct Failure: Error, CustomStringConvertible, Sendable {
        public let description: String
        init(_ description: String) { self.description = description }
    }

    public let configuration: Configuration
    private let logger: Logger
    private let binaries: String
    /// Directory of the server's Unix socket (short path: sockets are limited to 107 bytes).
    public let socketDirectory: String
    /// This process's share of the users lock, once `start()` took it (closed in deinit).
    private let use = Lock<Int32?>(nil)

    /// The lock file every user of the cluster holds shared (beside the data directory, which
    /// belongs to the server's account).
    public var usersLockPath: String { configuration.dataDirectory + ".users.lock" }

    /// Finds the binaries and prepares paths; starts nothing.
    /// - Throws: `Failure` with installation advice when the PostgreSQL binaries are missing.
    public init(configuration: Configuration, logger: Logger = Logger(label: "embedded-postgres")) throws {
        var configuration = configuration
        configuration.dataDirectory = URL(fileURLWithPath: configuration.dataDirectory).standardizedFileURL.path
        self.configuration = configuration
        self.logger = logger
        guard let binaries = Self.findBinaries(configuration.binaryDirectory) else {
            throw Failure(
                "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found. Install them with "
                    + "`apt-get install postgresql`, set POSTGRES_BIN_DIR to their directory, "
                    + "or set DATABASE_URL to use an existing server.")
        }
        self.binaries = binaries
        let preferred = configuration.dataDirectory + "/run"
        if preferred.utf8.count + 20 < 100 {
            socketDirectory = preferred
        } else {
            // Too long for sun_path: use a short directory derived from the data directory.
            var hash: UInt64 = 14_695_981_039_346_656_037
            for byte in configuration.dataDirectory.utf8 { hash = (hash ^ UInt64(byte)) &* 1_099_511_628_211 }
            socketDirectory = "/tmp/abk-pg-\(String(hash, radix: 36))"
        }
    }

    /// How to connect to the running cluster.
    public var connectionConfiguration: PostgresConfiguration {
        // Values are simple paths and names; conninfo quoting covers spaces and quotes anyway.
        try! PostgresConfiguration(
            connectionString:
                "host=\(Self.quote(socketDirectory)) port=5432 user=\(Self.quote(configuration.superuser)) "
                + "dbname=\(Self.quote(configuration.database))")
    }

    deinit {
        use.withLock { descriptor in
            if let descriptor { close(descriptor) }
        }
    }

    private var runsAsOtherUser: Bool { geteuid() == 0 }

    /// Initialises the cluster if needed and starts it unless it is already running.
    /// - Returns: true when this call started the server (so the caller should stop it).
    @discardableResult
    public func start() throws -> Bool {
        try prepareDirectories()
        try holdUse()
        if !FileManager.default.fileExists(atPath: configuration.dataDirectory + "/PG_VERSION") {
            logger.info("initialising embedded PostgreSQL cluster", [("data_directory", configuration.dataDirectory)])
            try run(
                binaries + "/initdb",
                [
                    "-D", configuration.dataDirectory, "-U", configuration.superuser, "--auth=trust",
                    "--encoding=UTF8", "--locale=C.UTF-8", "--no-instructions",
                ]
                    + (configuration.durable ? [] : ["--no-sync"]))
        }
        try prepare(socketDirectory)
        if isRunning() {
            logger.info("embedded PostgreSQL already running", [("data_directory", configuration.dataDirectory)])
            return false
        }
        var options = ["-c listen_addresses=''", "-c port=5432", "-k \(socketDirectory)", "-c unix_socket_permissions=0700"]
        if !configuration.durable {
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        }
        for (name, value) in configuration.settings.sorted(by: { $0.key < $1.key }) {
            options.append("-c \(name)=\(value)")
        }
        // The watchdog first: killed between the two, this process leaves nothing running.
        startWatchdog()
        try run(
            binaries + "/pg_ctl",
            [
                "-D", configuration.dataDirectory, "-l", configuration.dataDirectory + "/server.log",
                "-o", options.joined(separator: " "), "-w", "-t", "60", "start",
            ])
        logger.info("embedded PostgreSQL started", [("socket_directory", socketDirectory)])
        return true
    }

    /// Stops the server (fast shutdown: open transactions roll back).
    public func stop() throws {
        guard isRunning() else { return }
        try run(binaries + "/pg_ctl", ["-D", configuration.dataDirectory, "-m", "fast", "-w", "-t", "60", "stop"])
        logger.info("embedded PostgreSQL stopped")
    }

    /// Stops and starts the server again (tests of reconnection).
    public func restart() throws {
        try stop()
        try start()
    }

    /// Whether a server is running on this data directory.
    public func isRunning() -> Bool {
        guard FileManager.default.fileExists(atPath: configuration.dataDirectory + "/postmaster.pid") else { return false }
        return (try? run(binaries + "/pg_ctl", ["-D", configuration.dataDirectory, "status"], quiet: true)) != nil
    }

    // MARK: Internals

    /// Takes this process's shared lock on `usersLockPath` (once). Blocks while a watchdog
    /// holds it exclusively, i.e. while it is stopping the server: then this start begins
    /// again from a stopped cluster.
    private func holdUse() throws {
        try use.withLock { held in
            guard held == nil else { return }
            // Close-on-exec: a child (pg_ctl, the postmaster) must not keep our share alive.
            let descriptor = open(usersLockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
            guard descriptor >= 0 else {
                throw Failure("cannot open \(usersLockPath): \(String(cString: strerror(errno)))")
            }
            while flock(descriptor, LOCK_SH) != 0 {
                guard errno == EINTR else {
                    let reason = String(cString: strerror(errno))
                    close(descriptor)
                    throw Failure("cannot lock \(usersLockPath): \(reason)")
                }
            }
            held = descriptor
        }
    }

    /// Starts `flock --exclusive usersLockPath pg_ctl stop`, detached (its own session, so
    /// neither Ctrl-C nor a closed terminal reaches it). It waits, blocked in the kernel,
    /// until no process holds the lock shared, stops the server and exits.
    private func startWatchdog() {
        guard let flock = ["/usr/bin/flock", "/bin/flock"].first(where: { FileManager.default.isExecutableFile(atPath: $0) })
        else {
            logger.warning("util-linux flock not found: the embedded PostgreSQL may outlive a killed broker")
            return
        }
        let stop = [binaries + "/pg_ctl", "-D", configuration.dataDirectory, "-m", "fast", "-w", "-t", "60", "stop"]
        let (executable, arguments) = command(stop)
        do {
            _ = try ChildProcess.start(
                flock, ["--exclusive", usersLockPath, executable] + arguments, environment: environment(), output: .null,
                detached: true)
        } catch {
            logger.warning("cannot start the embedded PostgreSQL watchdog", [("error", "\(error)")])
        }
    }

    /// The program and arguments that run `program` as the server's account.
    private func command(_ program: [String]) -> (String, [String]) {
        runsAsOtherUser
            ? ("/usr/sbin/runuser", ["-u", configuration.systemUser, "--"] + program)
            : (program[0], Array(program.dropFirst()))
    }

    private func environment() -> [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["LC_ALL"] = "C.UTF-8"
        environment.removeValue(forKey: "PGDATA")
        return environment
    }

    private func prepareDirectories() throws {
        let data = configuration.dataDirectory
        try prepare(data)
        // Every parent must be searchable by that account, or initdb fails obscurely.
        if (try? run("/usr/bin/test", ["-w", data], quiet: true)) == nil {
            throw Failure(
                "the account '\(configuration.systemUser)' cannot reach \(data); a parent directory is private. "
                    + "Choose a data directory under a world-searchable path (BROKER_DATA_DIR=/var/lib/appleid-broker)")
        }
    }

    /// Creates a private directory owned by the account the server runs as.
    private func prepare(_ path: String) throws {
        let parent = (path as NSString).deletingLastPathComponent
        try FileManager.default.createDirectory(atPath: parent, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(
            atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        guard runsAsOtherUser else { return }
        guard let account = getpwnam(configuration.systemUser) else {
            throw Failure(
                "running as root, the embedded PostgreSQL needs the unprivileged account "
                    + "'\(configuration.systemUser)' (created by `apt-get install postgresql`)")
        }
        guard chown(path, account.pointee.pw_uid, account.pointee.pw_gid) == 0 else {
            throw Failure("cannot hand \(path) to \(configuration.systemUser): \(String(cString: strerror(errno)))")
        }
    }

    /// Runs a program (as the unprivileged account when root), throwing with its output on failure.
    @discardableResult
    private func run(_ program: String, _ arguments: [String], quiet: Bool = false) throws -> String {
        let (executable, fullArguments) = command([program] + arguments)
        let result: (status: Int32, output: String)
        do {
            result = try ChildProcess.run(executable, fullArguments, environment: environment())
        } catch {
            throw Failure("cannot run \(program): \(error)")
        }
        guard result.status == 0 else {
            if !quiet {
                logger.error("PostgreSQL command failed", [("program", program), ("output", result.output)])
            }
            throw Failure("\((program as NSString).lastPathComponent) failed (exit \(result.status)): \(result.output)")
        }
        return result.output
    }

    private static func findBinaries(_ configured: String?) -> String? {
        let manager = FileManager.default
        func valid(_ directory: String) -> Bool {
            ["initdb", "pg_ctl", "postgres"].allSatisfy { manager.isExecutableFile(atPath: directory + "/" + $0) }
        }
        if let configured { return valid(configured) ? configured : nil }
        if let fromEnvironment = ProcessInfo.processInfo.environment["POSTGRES_BIN_DIR"], valid(fromEnvironment) {
            return fromEnvironment
        }
        let versions = (try? manager.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? []
        for version in versions.sorted(by: { (Int($0) ?? 0) > (Int($1) ?? 0) }) {
            let directory = "/usr/lib/postgresql/\(version)/bin"
            if valid(directory) { return directory }
        }
        for directory in ["/usr/local/pgsql/bin", "/usr/bin", "/usr/local/bin"] where valid(directory) {
            return directory
        }
        return nil
    }

    private static func quote(_ value: String) -> String {
        "'" + value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "\\'") + "'"
    }
}
