import BrokerCrypto
import Observability
import PostgresClient

/// One numbered schema change from the package's `sql/` folder (compiled into the binary).
public struct Migration: Sendable, Equatable {
    /// The number the file name starts with (`0001_initial.sql` → 1).
    public let version: Int
    public let name: String
    public let sql: String
    /// SHA-256 of the text, to notice a migration edited after it was applied.
    public var checksum: String { SHA256.hexHash(sql) }

    public init(version: Int, name: String, sql: String) {
        self.version = version
        self.name = name
        self.sql = sql
    }
}

/// Applies pending migrations in order, each in its own transaction, under a PostgreSQL
/// advisory lock so concurrent starters (replicas, the CLI) never apply one twice.
/// Applied versions are recorded in `schema_migrations`; running again changes nothing.
public enum Migrations {
    /// Every migration, ordered by version.
    public static let all: [Migration] = EmbeddedFiles.files.filter { $0.name.hasSuffix(".sql") }.map { file in
        let digits = file.name.prefix { $0.isNumber }
        guard let version = Int(digits), !digits.isEmpty else {
            preconditionFailure("migration file \(file.name) must start with its number")
        }
        return Migration(version: version, name: file.name, sql: file.text)
    }.sorted { $0.version < $1.version }

    /// Arbitrary constant identifying this service's migration lock ("abkm").
    static let advisoryLockKey: Int64 = 0x6162_6B6D

    /// A migration recorded as applied differs from the one in this binary.
    public struct ChecksumMismatch: Error, CustomStringConvertible {
        public let name: String
        public var description: String {
            "migration \(name) was changed after it was applied; add a new migration instead of editing it"
        }
    }

    /// Applies what is pending.
    /// - Returns: the names of the migrations applied by this call.
    @discardableResult
    public static func apply(
        _ migrations: [Migration] = all, configuration: PostgresConfiguration, logger: Logger
    ) throws -> [String] {
        // A dedicated connection: the advisory lock belongs to the session.
        let connection = try PostgresConnection(configuration: configuration)
        try connection.query("SELECT pg_advisory_lock(\(advisoryLockKey))")
        defer { _ = try? connection.query("SELECT pg_advisory_unlock(\(advisoryLockKey))") }
        try connection.execute(
            """
            CREATE TABLE IF NOT EXISTS schema_migrations (
                version     integer PRIMARY KEY,
                name        text NOT NULL,
                checksum    text NOT NULL,
                applied_at  timestamptz NOT NULL DEFAULT now()
            )
            """)
        var applied: [Int: (name: String, checksum: String)] = [:]
        for row in try connection.query("SELECT version, name, checksum FROM schema_migrations") {
            applied[try row.decode(Int.self, "version")] = (try row.decode(String.self, "name"), try row.decode(String.self, "checksum"))
        }
        var appliedNow: [String] = []
        for migration in migrations {
            if let existing = applied[migration.version] {
                guard existing.checksum == migration.checksum else { throw ChecksumMismatch(name: migration.name) }
                continue
            }
            try connection.execute("BEGIN")
            do {
                try connection.execute(migration.sql)
                try connection.query(
                    """
                    INSERT INTO schema_migrations (version, name, checksum)
                    VALUES (\(migration.version), \(migration.name), \(migration.checksum))
                    """)
                try connection.execute("COMMIT")
            } catch {
                _ = try? connection.execute("ROLLBACK")
                throw error
            }
            logger.notice("applied migration", [("migration", migration.name)])
            appliedNow.append(migration.name)
        }
        return appliedNow
    }
}
