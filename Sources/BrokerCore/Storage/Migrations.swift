import BrokerCrypto
import Observability
import PostgresClient

/// One numbered schema change from the package's `sql/` folder (compiled into the binary).
public struct Migration: Sendable, Equatable {
    /// The number the file name starts with (`0001_initial.sql` → 1).
    public let version: Int
    public let name: String
    public let sql: String
    /// Checksums of this migration's text as an earlier release shipped it (`sql/former-checksums`):
    /// the function bodies it held moved to `sql/functions/`, its schema change did not change.
    public let formerChecksums: Set<String>
    /// SHA-256 of the text, to notice a migration edited after it was applied.
    public var checksum: String { SHA256.hexHash(sql) }

    public init(version: Int, name: String, sql: String, formerChecksums: Set<String> = []) {
        self.version = version
        self.name = name
        self.sql = sql
        self.formerChecksums = formerChecksums
    }

    /// Whether a database that recorded `checksum` for this migration applied this very change.
    func accepts(_ recorded: String) -> Bool { recorded == checksum || formerChecksums.contains(recorded) }
}

/// One file of `sql/functions/`: the live definition of one SQL function (and its trigger, for a
/// trigger function), written to be run again and again (CREATE OR REPLACE).
public struct SQLFunction: Sendable, Equatable {
    /// The file name (`broker_login.sql`).
    public let name: String
    public let sql: String
    public var checksum: String { SHA256.hexHash(sql) }

    public init(name: String, sql: String) {
        self.name = name
        self.sql = sql
    }
}

/// Brings a database to this release: pending migrations in order, then every function file,
/// in ONE transaction under a transaction-scoped advisory lock, so concurrent starters (replicas,
/// the CLI) never apply one twice and nothing is held in the session (it works through
/// PgBouncer's transaction pooling). Applied versions are recorded in `schema_migrations`;
/// running again changes nothing. See docs/database.md for the expand/contract rules.
public enum Migrations {
    /// Every migration, ordered by version.
    public static let all: [Migration] = EmbeddedFiles.files.filter { $0.name.hasSuffix(".sql") && !$0.name.contains("/") }
        .map { file in
            let digits = file.name.prefix { $0.isNumber }
            guard let version = Int(digits), !digits.isEmpty else {
                preconditionFailure("migration file \(file.name) must start with its number")
            }
            return Migration(version: version, name: file.name, sql: file.text, formerChecksums: formerChecksums[file.name] ?? [])
        }.sorted { $0.version < $1.version }

    /// Every function file, ordered by name (the order does not matter: bodies are checked
    /// when called, see `apply`).
    public static let functions: [SQLFunction] = EmbeddedFiles.files.filter { $0.name.hasPrefix("functions/") }
        .map { SQLFunction(name: String($0.name.dropFirst("functions/".count)), sql: $0.text) }
        .sorted { $0.name < $1.name }

    /// `sql/former-checksums`: "<file> <sha256>" lines, `#` comments.
    static let formerChecksums: [String: Set<String>] = {
        var checksums: [String: Set<String>] = [:]
        for line in (EmbeddedFiles.text(named: "former-checksums") ?? "").split(separator: "\n") where !line.hasPrefix("#") {
            let fields = line.split(separator: " ")
            guard fields.count == 2 else { preconditionFailure("sql/former-checksums: malformed line \(line)") }
            checksums[String(fields[0]), default: []].insert(String(fields[1]))
        }
        return checksums
    }()

    /// Arbitrary constant identifying this service's migration lock ("abkm"). Releases before
    /// v0.25 took it at session level; both kinds of hold exclude each other.
    static let advisoryLockKey: Int64 = 0x6162_6B6D

    /// A migration recorded as applied differs from the one in this binary.
    public struct ChecksumMismatch: Error, CustomStringConvertible {
        public let name: String
        public var description: String {
            "migration \(name) was changed after it was applied; add a new migration instead of editing it"
        }
    }

    /// Applies what is pending, then the function files.
    /// - Returns: the names of the migrations applied by this call.
    @discardableResult
    public static func apply(
        _ migrations: [Migration] = all, functions: [SQLFunction] = functions,
        configuration: PostgresConfiguration, logger: Logger
    ) throws -> [String] {
        let connection = try PostgresConnection(configuration: configuration)
        var appliedNow: [String] = []
        try connection.execute("BEGIN")
        do {
            // Held until COMMIT or ROLLBACK: a second starter waits here, then sees what this one recorded.
            try connection.query("SELECT pg_advisory_xact_lock(\(advisoryLockKey))")
            try connection.execute(
                """
                CREATE TABLE IF NOT EXISTS schema_migrations (
                    version     integer PRIMARY KEY,
                    name        text NOT NULL,
                    checksum    text NOT NULL,
                    applied_at  timestamptz NOT NULL DEFAULT now()
                )
                """)
            var applied: [Int: String] = [:]
            for row in try connection.query("SELECT version, checksum FROM schema_migrations") {
                applied[try row.decode(Int.self, "version")] = try row.decode(String.self, "checksum")
            }
            for migration in migrations {
                if let recorded = applied[migration.version] {
                    guard migration.accepts(recorded) else { throw ChecksumMismatch(name: migration.name) }
                    continue
                }
                try connection.execute(migration.sql)
                try connection.query(
                    """
                    INSERT INTO schema_migrations (version, name, checksum)
                    VALUES (\(migration.version), \(migration.name), \(migration.checksum))
                    """)
                appliedNow.append(migration.name)
            }
            // The functions are written against the schema after every migration. A SQL-language
            // body would otherwise be checked at CREATE and need the functions it calls to exist
            // first (pg_dump does the same); MigrationTests checks every body.
            try connection.execute("SET LOCAL check_function_bodies = off")
            for function in functions {
                try connection.execute(function.sql)
            }
            try connection.execute("COMMIT")
        } catch {
            _ = try? connection.execute("ROLLBACK")
            throw error
        }
        for name in appliedNow {
            logger.notice("applied migration", [("migration", name)])
        }
        return appliedNow
    }
}
