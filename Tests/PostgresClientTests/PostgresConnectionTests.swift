import Foundation
import PostgresClient
import TestSupport
import Testing

@Suite("PostgresConnection", .offPool)
struct PostgresConnectionTests {
    @Test("a named statement is prepared again after 100 runs, so a plan made while the tables were empty does not stay")
    func replans() throws {
        let connection = try PostgresConnection(configuration: try TestPostgres.freshDatabase())
        let sql = "SELECT $1::int AS n"
        func prepared() throws -> [String] {
            try connection.query("SELECT name FROM pg_prepared_statements WHERE statement = \(sql) ORDER BY name").map {
                try $0.decode(String.self, "name")
            }
        }
        func run(_ value: Int) throws -> Int {
            try connection.query(PostgresQuery(unsafeSQL: sql, binds: [.text(String(value))])).single().decode(Int.self, "n")
        }
        for value in 1...100 { #expect(try run(value) == value) }
        let first = try prepared()
        #expect(first.count == 1)
        #expect(try run(101) == 101)
        let second = try prepared()
        #expect(second.count == 2 && second.contains(first[0]), "the 101st run went out under a new name: \(second)")
        for value in 102...999 { _ = try run(value) }
        #expect(try prepared().count == 2, "not again before the 1,000th run")
        _ = try run(1000)
        _ = try run(1001)
        #expect(try prepared().count == 3)
    }

    @Test("binds and decodes every supported type, NULL and non-ASCII text included")
    func roundTripsTypes() throws {
        let connection = try PostgresConnection(configuration: try TestPostgres.freshDatabase())
        try connection.execute(
            """
            CREATE TABLE t (
                s text, i bigint, small int, b boolean, d double precision, u uuid, ts timestamptz,
                raw bytea, doc jsonb, missing text)
            """)
        let id = UUID()
        let when = Date(timeIntervalSince1970: 1_767_225_600.123456)
        let text = "Zoë 東京 🍏 'quoted' \"double\" \\ back"
        let bytes: [UInt8] = [0, 1, 2, 255, 0, 39, 92]
        let json = try PostgresJSON(encoding: ["name": "Zoë", "n": "1"])
        let missing: String? = nil
        try connection.query(
            """
            INSERT INTO t (s, i, small, b, d, u, ts, raw, doc, missing)
            VALUES (\(text), \(Int64.max), \(Int32(-7)), \(true), \(2.5), \(id), \(when), \(bytes), \(json), \(missing))
            """)
        let row = try connection.query("SELECT s, i, small, b, d, u, ts, raw, doc, missing FROM t").single()
        #expect(try row.decode(String.self, "s") == text)
        #expect(try row.decode(Int64.self, "i") == Int64.max)
        #expect(try row.decode(Int32.self, "small") == -7)
        #expect(try row.decode(Bool.self, "b") == true)
        #expect(try row.decode(Double.self, "d") == 2.5)
        #expect(try row.decode(UUID.self, "u") == id)
        let decodedDate = try row.decode(Date.self, "ts")
        #expect(abs(decodedDate.timeIntervalSince1970 - when.timeIntervalSince1970) < 0.000_001)
        #expect(try row.decode([UInt8].self, "raw") == bytes)
        #expect(try row.decode(PostgresJSON.self, "doc").decode([String: String].self) == ["name": "Zoë", "n": "1"])
        #expect(try row.decode(String?.self, "missing") == nil)
        #expect(try row.isNull(9))
        // A bound Date is the same instant in PostgreSQL's own text (digits written by hand).
        for (seconds, expected) in [
            (0.5, "1970-01-01 00:00:00.5+00"), (951_868_799.25, "2000-02-29 23:59:59.25+00"),
            (1_767_225_600.015625, "2026-01-01 00:00:00.015625+00"), (253_402_300_799, "9999-12-31 23:59:59+00"),
        ] {
            let date = Date(timeIntervalSince1970: seconds)
            #expect(
                try connection.query("SELECT (\(date))::timestamptz::text AS t").single().decode(String.self, "t") == expected)
        }
        #expect(throws: PostgresError.self) { try row.decode(String.self, "missing") }
    }

    @Test("a text[] parameter keeps every element whole: commas, braces, quotes, backslashes, NULL-looking text")
    func textArrays() throws {
        let connection = try PostgresConnection(configuration: try TestPostgres.freshDatabase())
        let elements = ["com.example.app", "a,b", "{x}", "say \"hi\"", "back\\slash", "NULL", "", "Zoë 🍏"]
        let rows = try connection.query(
            "SELECT x FROM unnest(\(PostgresTextArray(elements))::text[]) WITH ORDINALITY AS u(x, n) ORDER BY n")
        #expect(try rows.map { try $0.decode(String.self, 0) } == elements)
        let empty = try connection.query("SELECT cardinality(\(PostgresTextArray([]))::text[])").single()
        #expect(try empty.decode(Int.self, 0) == 0)
        let match = try connection.query("SELECT 'a,b' = ANY (\(PostgresTextArray(elements))::text[])").single()
        #expect(try match.decode(Bool.self, 0))
    }

    @Test("timestamps with non-UTC offsets decode to the same instant")
    func decodesOffsets() throws {
        let connection = try PostgresConnection(configuration: try TestPostgres.freshDatabase())
        let row = try connection.query(
            "SELECT '2026-01-01 05:30:00+05:30'::timestamptz::text AS a, timestamptz '2026-01-01 00:00:00Z' AS b"
        ).single()
        #expect(try row.decode(Date.self, "b") == Date(timeIntervalSince1970: 1_767_225_600))
        #expect(try row.decode(Date.self, "a") == Date(timeIntervalSince1970: 1_767_225_600))
    }

    @Test("a unique violation carries SQLSTATE 23505 and the constraint, not the values")
    func uniqueViolation() throws {
        let connection = try PostgresConnection(configuration: try TestPostgres.freshDatabase())
        try connection.execute("CREATE TABLE people (email text CONSTRAINT people_email_key UNIQUE)")
        let secret = "jane.secret@example.com"
        try connection.query("INSERT INTO people VALUES (\(secret))")
        let error = #expect(throws: PostgresError.self) {
            try connection.query("INSERT INTO people VALUES (\(secret))")
        }
        #expect(error?.sqlState == "23505")
        #expect(error?.isUniqueViolation == true)
        #expect(error?.constraint == "people_email_key")
        #expect(error?.code == .queryFailed)
        let printed = "\(error!) \(String(reflecting: error!))"
        #expect(printed.contains("23505"))
        #expect(!printed.contains(secret))
    }

    @Test("errors never print bind parameters, even when the server quotes them")
    func errorsHideParameters() throws {
        let connection = try PostgresConnection(configuration: try TestPostgres.freshDatabase())
        let secret = "not-a-uuid-but-a-secret-token"
        let error = #expect(throws: PostgresError.self) {
            try connection.query("SELECT \(secret)::uuid")
        }
        #expect(error?.sqlState == "22P02")
        #expect(error?.serverMessage?.contains(secret) == true, "the server quotes the value…")
        #expect(!"\(error!)".contains(secret), "…but printing the error does not")
        #expect(!String(reflecting: error!).contains(secret))
    }

    @Test("text with a NUL byte is refused before it reaches the server")
    func refusesNul() throws {
        let connection = try PostgresConnection(configuration: try TestPostgres.freshDatabase())
        let error = #expect(throws: PostgresError.self) { try connection.query("SELECT \("a\u{0}b")") }
        #expect(error?.code == .invalidBind)
    }

    @Test("an unreachable server is a connectionFailed error that says it is unavailable")
    func connectionFailure() throws {
        let configuration = try PostgresConfiguration(connectionString: "host=/nonexistent-socket-dir dbname=x")
        let error = #expect(throws: PostgresError.self) { try PostgresConnection(configuration: configuration) }
        #expect(error?.code == .connectionFailed)
        #expect(error?.isUnavailable == true)
        // The reason is in the description, not only the code (issue 29 item 7).
        #expect(error.map { "\($0)" }?.contains("/nonexistent-socket-dir") == true)
    }

    /// What PgBouncer in transaction pooling needs (issue 29 item 7): no `options` startup
    /// parameter, no named prepared statements, and the settings in every transaction,
    /// whatever the role's defaults say.
    @Test(
        "through a pooler, settings apply per transaction and per autocommit statement, without startup options or named statements"
    )
    func settingsPerTransaction() throws {
        var configuration = try TestPostgres.freshDatabase()
        let admin = try PostgresConnection(configuration: configuration)
        #expect(!admin.isPooled, "a direct connection is recognised as one")
        let database = try admin.query("SELECT current_database() AS name").single().decode(String.self, "name")
        try admin.execute(
            "ALTER DATABASE \(database) SET TimeZone = 'Asia/Kolkata'; ALTER DATABASE \(database) SET DateStyle = 'SQL, DMY'")
        // Directly connected, the settings are the session's, whatever the database's defaults.
        let direct = try PostgresConnection(configuration: configuration)
        let session = try direct.execute("SELECT current_setting('TimeZone') AS tz, current_setting('DateStyle') AS ds").single()
        #expect(try session.decode(String.self, "tz") == "UTC")
        #expect(try session.decode(String.self, "ds") == "ISO, DMY")
        configuration.transactionPooling = true
        configuration.statementTimeoutMilliseconds = 250
        let pool = PostgresPool(configuration: .init(connection: configuration, maximumConnections: 1))
        let autocommit = try pool.query(
            "SELECT current_setting('TimeZone') AS tz, current_setting('DateStyle') AS ds, now() AS at"
        ).single()
        let autocommitAt = try autocommit.decode(Date.self, "at")
        #expect(try autocommit.decode(String.self, "tz") == "UTC")
        #expect(try autocommit.decode(String.self, "ds") == "ISO, DMY")
        #expect(abs(autocommitAt.timeIntervalSinceNow) < 60)
        let inside = try pool.withTransaction { try $0.query("SELECT current_setting('statement_timeout') AS t").single() }
        #expect(try inside.decode(String.self, "t") == "250ms")
        let error = #expect(throws: PostgresError.self) { try pool.query("SELECT pg_sleep(2)") }
        #expect(error?.sqlState == "57014")
        try pool.withConnection { connection in
            let prepared = try connection.query("SELECT count(*) AS n FROM pg_prepared_statements").single()
            #expect(try prepared.decode(Int.self, "n") == 0)
            // Outside our statements the session keeps the database default: nothing was set for the session.
            let session = try connection.execute("SHOW TimeZone").single()
            #expect(try session.decode(String.self, "TimeZone") == "Asia/Kolkata")
        }
    }

    @Test("a malformed DATABASE_URL is rejected with libpq's reason")
    func invalidConfiguration() {
        let error = #expect(throws: PostgresError.self) {
            try PostgresConfiguration(connectionString: "postgres://host:notaport/db?sslmode")
        }
        #expect(error?.code == .invalidConfiguration)
    }
}
