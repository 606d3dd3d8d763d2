import BrokerAPI
import BrokerCore
import Foundation
import Observability
import PostgresClient
import TestSupport
import Testing

@Suite("Migrations")
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
        let database = try TestPostgres.freshDatabase()
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
        let database = try TestPostgres.freshDatabase()
        let logger = self.logger
        let results = try onThreads(4) { _ in try Migrations.apply(configuration: database, logger: logger) }
            .map { try $0.get() }
        #expect(results.flatMap { $0 }.sorted() == Migrations.all.map(\.name).sorted())
    }

    @Test("a migration edited after it was applied is refused")
    func checksumMismatch() throws {
        let database = try TestPostgres.freshDatabase()
        try Migrations.apply(configuration: database, logger: logger)
        var edited = Migrations.all
        edited[0] = Migration(version: edited[0].version, name: edited[0].name, sql: edited[0].sql + "\n-- edited")
        #expect(throws: Migrations.ChecksumMismatch.self) {
            try Migrations.apply(edited, configuration: database, logger: logger)
        }
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
