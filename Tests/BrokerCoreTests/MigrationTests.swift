import BrokerAPI
import BrokerCore
import BrokerCrypto
import Foundation
import Observability
import PostgresClient
import TestSupport
import Testing

@Suite("Migrations", .offPool)
struct MigrationTests {
    let logger = Logger(label: "test", sink: .capturing())

    private func schema(_ connection: PostgresConnection) throws -> [String] {
        try connection.query(
            """
            SELECT table_name || '.' || column_name || ':' || data_type || ':' || is_nullable
            FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1
            """
        ).map { try $0.decode(String.self, 0) }
    }

    @Test("applying twice changes nothing")
    func idempotent() throws {
        let database = try TestPostgres.emptyDatabase()
        let first = try Migrations.apply(configuration: database, logger: logger)
        #expect(first == Migrations.all.map(\.name))
        let connection = try PostgresConnection(configuration: database)
        let before = try schema(connection)
        let recorded = try connection.query("SELECT count(*) FROM schema_migrations").single().decode(Int.self, 0)

        let second = try Migrations.apply(configuration: database, logger: logger)
        #expect(second.isEmpty)
        #expect(try schema(connection) == before)
        #expect(try connection.query("SELECT count(*) FROM schema_migrations").single().decode(Int.self, 0) == recorded)
        #expect(before.contains("apple_identities.sub:text:NO"))
    }

    @Test("concurrent starters apply each migration exactly once")
    func concurrentStarters() throws {
        let database = try TestPostgres.emptyDatabase()
        let logger = self.logger
        let results = try onThreads(4) { _ in try Migrations.apply(configuration: database, logger: logger) }
            .map { try $0.get() }
        #expect(results.flatMap { $0 }.sorted() == Migrations.all.map(\.name).sorted())
    }

    @Test("a migration edited after it was applied is refused")
    func checksumMismatch() throws {
        let database = try TestPostgres.emptyDatabase()
        try Migrations.apply(configuration: database, logger: logger)
        var edited = Migrations.all
        edited[0] = Migration(version: edited[0].version, name: edited[0].name, sql: edited[0].sql + "\n-- edited")
        #expect(throws: Migrations.ChecksumMismatch.self) {
            try Migrations.apply(edited, configuration: database, logger: logger)
        }
    }

    @Test("a database migrated by the previous release (the former checksums recorded) is accepted; another checksum is not")
    func formerChecksums() throws {
        // The migrations whose function bodies moved to sql/functions/ (v0.24.0's texts).
        let moved = Migrations.all.filter { !$0.formerChecksums.isEmpty }.map(\.name)
        #expect(
            moved == [
                "0001_initial.sql", "0002_login.sql", "0003_notifications_and_deletions.sql", "0004_deletion_job.sql",
                "0005_webhook_claim.sql", "0007_app_groups.sql", "0008_revocation_without_token.sql",
                "0011_keyed_subject_hashes.sql", "0012_limited_api_keys.sql",
            ])
        #expect(Migrations.all.allSatisfy { !$0.formerChecksums.contains($0.checksum) })
        let database = try TestPostgres.freshDatabase()
        try Migrations.apply(configuration: database, logger: logger)
        let connection = try PostgresConnection(configuration: database)
        for migration in Migrations.all {
            guard let former = migration.formerChecksums.first else { continue }
            try connection.query("UPDATE schema_migrations SET checksum = \(former) WHERE version = \(migration.version)")
        }
        #expect(try Migrations.apply(configuration: database, logger: logger).isEmpty)

        try connection.query("UPDATE schema_migrations SET checksum = \(String(repeating: "0", count: 64)) WHERE version = 2")
        let refused = #expect(throws: Migrations.ChecksumMismatch.self) {
            try Migrations.apply(configuration: database, logger: logger)
        }
        #expect(refused?.name == "0002_login.sql")
    }

    @Test("a fresh database ends with the catalog of one the previous release migrated and this release upgraded")
    func catalog() throws {
        let database = try TestPostgres.emptyDatabase()
        try Migrations.apply(configuration: database, logger: logger)
        let connection = try PostgresConnection(configuration: database)
        let lines = try connection.execute(try Repository.text("sql/catalog/describe.sql")).map { try $0.decode(String.self, 0) }
        // sql/catalog/expected.txt: written by scripts/rolling-upgrade.sh from a database the
        // previous release migrated and this release then upgraded.
        let expected = try Repository.text("sql/catalog/expected.txt").split(separator: "\n").map(String.init)
        #expect(lines.filter { !expected.contains($0) } == [], "in a fresh database only")
        #expect(expected.filter { !lines.contains($0) } == [], "in an upgraded database only")
    }

    @Test("the function files are applied on every start, whatever a database holds")
    func functionsReapplied() throws {
        let database = try TestPostgres.freshDatabase()
        try Migrations.apply(configuration: database, logger: logger)
        let connection = try PostgresConnection(configuration: database)
        let body = "SELECT prosrc FROM pg_proc WHERE proname = 'broker_user_client_ids'"
        let live = try connection.query(PostgresQuery(unsafeSQL: body)).single().decode(String.self, 0)
        try connection.execute(
            "CREATE OR REPLACE FUNCTION broker_user_client_ids(p_user_id uuid) RETURNS text[] LANGUAGE sql STABLE AS $$ SELECT '{}'::text[] $$"
        )
        try connection.execute("DROP TRIGGER audit_log_append_only ON audit_log")
        #expect(try Migrations.apply(configuration: database, logger: logger).isEmpty)
        #expect(try connection.query(PostgresQuery(unsafeSQL: body)).single().decode(String.self, 0) == live)
        try connection.query("INSERT INTO audit_log (actor, action) VALUES ('test', 'x')")
        #expect(throws: PostgresError.self) { try connection.query("DELETE FROM audit_log") }
    }

    @Test("every function file defines the function it is named after, and its body checks against the schema")
    func functionBodies() throws {
        #expect(Migrations.functions.count >= 12)
        let database = try TestPostgres.freshDatabase()
        try Migrations.apply(configuration: database, logger: logger)
        let connection = try PostgresConnection(configuration: database)
        try connection.execute("BEGIN")
        defer { _ = try? connection.execute("ROLLBACK") }
        // Migrations applies them with check_function_bodies off; here every function exists.
        try connection.execute("SET LOCAL check_function_bodies = on")
        for function in Migrations.functions {
            let stem = String(function.name.dropLast(".sql".count))
            #expect(function.sql.contains("CREATE OR REPLACE FUNCTION \(stem)("), "\(function.name)")
            try connection.execute(function.sql)
        }
    }

    @Test("a released function file never changes (a new meaning gets a new name); no migration creates a function")
    func releasedFunctions() throws {
        let files = Dictionary(uniqueKeysWithValues: Migrations.functions.map { ($0.name, $0.sql) })
        var released = 0
        for line in try Repository.text("sql/functions/RELEASED").split(separator: "\n") where !line.hasPrefix("#") {
            let fields = line.split(separator: " ").map(String.init)
            #expect(fields.count == 3, "\(line)")
            guard fields.count == 3 else { continue }
            released += 1
            guard let text = files[fields[0]] else {
                Issue.record(
                    "\(fields[0]) was released and is gone: drop a function in a migration, a release after its last user")
                continue
            }
            // The definition: the file from its first line that is not a comment.
            let definition = text.split(separator: "\n", omittingEmptySubsequences: false)
                .drop { $0.hasPrefix("--") }.joined(separator: "\n")
            #expect(SHA256.hexHash(definition) == fields[1], "\(fields[0]) changed after \(fields[2])")
        }
        #expect(released >= 12)
        for migration in Migrations.all {
            #expect(
                migration.sql.range(of: #"CREATE\s+(OR\s+REPLACE\s+)?FUNCTION"#, options: [.regularExpression, .caseInsensitive])
                    == nil,
                "\(migration.name): a function lives in sql/functions/")
        }
    }

    @Test("a starter of the previous release (session-level lock) and one of this release wait for each other")
    func lockAcrossReleases() throws {
        let database = try TestPostgres.emptyDatabase()
        let logger = self.logger
        // The new starter begins only once the old one holds the lock: started together, it
        // could finish first, and the holder would wait for a waiter that never comes.
        let held = DispatchSemaphore(value: 0)
        let results = onThreads(2) { index -> Bool in
            guard index == 0 else {
                held.wait()
                try Migrations.apply(configuration: database, logger: logger)
                return true
            }
            let holder: PostgresConnection
            do {
                holder = try PostgresConnection(configuration: database)
                try holder.execute("SELECT pg_advisory_lock(\(0x6162_6B6D))")
            } catch {
                held.signal()
                throw error
            }
            held.signal()
            // Until the other starter waits on the lock, then let it go.
            while try holder.query(
                """
                SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
                WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()
                """
            ).single().decode(Int.self, 0) == 0 {
                Thread.sleep(forTimeInterval: 0.01)
            }
            let tables = try holder.query("SELECT count(*) FROM pg_tables WHERE tablename = 'schema_migrations'").single()
                .decode(Int.self, 0)
            try holder.execute("SELECT pg_advisory_unlock(\(0x6162_6B6D))")
            return tables == 0
        }
        #expect(try results.map { try $0.get() } == [true, true])
    }

    @Test("deleting a user cascades to identities and tokens; (team_id, sub) is unique; the audit log is append-only")
    func constraints() throws {
        let database = try TestPostgres.freshDatabase()
        try Migrations.apply(configuration: database, logger: logger)
        let connection = try PostgresConnection(configuration: database)
        let user = UUID()
        let identity = UUID()
        try connection.query("INSERT INTO users (id) VALUES (\(user))")
        try connection.query(
            """
            INSERT INTO apple_identities (id, user_id, team_id, sub, client_id, email)
            VALUES (\(identity), \(user), 'TEAM', 'sub-1', 'com.example.app', 'a@example.com')
            """)
        try connection.query(
            """
            INSERT INTO apple_tokens (id, identity_id, user_id, client_id, refresh_token, key_id)
            VALUES (\(UUID()), \(identity), \(user), 'com.example.app', \([UInt8]([1, 2, 3])), 'k1')
            """)
        let duplicate = #expect(throws: PostgresError.self) {
            try connection.query(
                """
                INSERT INTO apple_identities (id, user_id, team_id, sub, client_id)
                VALUES (\(UUID()), \(user), 'TEAM', 'sub-1', 'com.example.app')
                """)
        }
        #expect(duplicate?.constraint == "apple_identities_team_sub_key")

        try connection.query("DELETE FROM users WHERE id = \(user)")
        #expect(try connection.query("SELECT count(*) FROM apple_identities").single().decode(Int.self, 0) == 0)
        #expect(try connection.query("SELECT count(*) FROM apple_tokens").single().decode(Int.self, 0) == 0)

        try connection.query("INSERT INTO audit_log (actor, action) VALUES ('test', 'x')")
        #expect(throws: PostgresError.self) { try connection.query("UPDATE audit_log SET action = 'y'") }
        #expect(throws: PostgresError.self) { try connection.query("DELETE FROM audit_log") }
    }
}
