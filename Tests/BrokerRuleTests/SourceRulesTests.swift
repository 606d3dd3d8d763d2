import Foundation
import TestSupport
import Testing

// The fast layer: rules about the source tree itself, no database, no socket.

/// Where SQL may be written (issue 31: persistence has one home). A statement in Swift source
/// belongs to
/// - a store: a file named `…Store.swift` or `…Store+….swift`, beside the service it serves;
/// - a `Storage/` folder: the database handle, the migration runner and the jobs that belong
///   to no one component (re-encryption, grant alignment, app reach, the event feed…);
/// - `Sources/PostgresClient/`: the driver;
/// - `Sources/broker-bench/`: the benchmark seeds its own rows.
/// Services, workers, routes and the wiring call stores; a `SELECT` anywhere else fails here.
enum SQLHome {
    static func allows(_ relativePath: String) -> Bool {
        let components = relativePath.split(separator: "/")
        guard let file = components.last else { return false }
        let name = file.hasSuffix(".swift") ? file.dropLast(".swift".count) : file[...]
        if name.hasSuffix("Store") || name.range(of: "Store+") != nil { return true }
        if components.dropLast().contains("Storage") { return true }
        return relativePath.hasPrefix("Sources/PostgresClient/") || relativePath.hasPrefix("Sources/broker-bench/")
    }

    /// Statements as they are written in our queries (upper-case keywords); comments are not code.
    static var statement: Regex<(Substring, Substring?)> {
        #/\bSELECT\s|\bINSERT\s+INTO\b|\bUPDATE\s+\w+(\s+\w+)?\s+SET\b|\bDELETE\s+FROM\b/#
    }

    /// `file:line: text` for each line of `text` that writes SQL outside a comment.
    static func statements(in text: String, file: String) -> [String] {
        var found: [String] = []
        for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let trimmed = line.drop { $0 == " " }
            if trimmed.hasPrefix("//") || trimmed.hasPrefix("*") { continue }
            // The keywords first: a regular expression on every line of the tree is slow.
            guard ["SELECT", "INSERT", "UPDATE", "DELETE"].contains(where: { line.contains($0) }) else { continue }
            if line.contains(statement) { found.append("\(file):\(index + 1): \(trimmed)") }
        }
        return found
    }
}

/// Who owns each table (issue 37): `oidc_*` the OpenID Provider, `console_*` the console, the
/// rest BrokerCore. Only the owner's stores name a table; another module asks the owner's
/// service. SQL function files belong to a module by the same prefixes (`broker_oidc_…`,
/// `broker_console_…`, else BrokerCore): a function names only its owner's tables, and only its
/// owner's stores call it. A trigger whose function belongs to another module than the table it
/// fires on is named in Swift in both modules, so the reaction can be read where the owners are.
enum TableOwners {
    /// The modules that own tables; every other module (the engine, the wiring) names none.
    static let owningModules: Set<String> = ["BrokerCore", "OpenIDProvider", "Console"]

    static func owner(ofTable name: String) -> String {
        if name.hasPrefix("oidc_") { return "OpenIDProvider" }
        if name.hasPrefix("console_") { return "Console" }
        return "BrokerCore"
    }

    static func owner(ofFunction name: String) -> String {
        if name.hasPrefix("broker_oidc_") { return "OpenIDProvider" }
        if name.hasPrefix("broker_console_") { return "Console" }
        return "BrokerCore"
    }

    /// Every table the migrations create.
    static func tables(migrations: [String]) -> Set<String> {
        Set(
            migrations.flatMap { text in
                text.matches(of: #/CREATE TABLE (?:IF NOT EXISTS )?([a-z_][a-z0-9_]*)/#).map { String($0.output.1) }
            })
    }

    /// Tables a line of SQL (or of a Swift store) names: after FROM, JOIN, INTO, UPDATE, USING or
    /// TABLE (our queries' keywords are upper case), or as a whole string literal (a lane's
    /// `DeliveryTable("…")`). Names that are no table (CTEs, aliases) are dropped.
    static func tables(in line: Substring, known: Set<String>) -> Set<String> {
        var found = Set<String>()
        for match in line.matches(of: #/\b(?:FROM|JOIN|INTO|UPDATE|USING|TABLE)\s+(?:ONLY\s+)?([a-z_][a-z0-9_]*)/#) {
            found.insert(String(match.output.1))
        }
        for match in line.matches(of: #/"([a-z_][a-z0-9_]*)"/#) { found.insert(String(match.output.1)) }
        return found.intersection(known)
    }

    /// `file:line: table (owner)` for each line of `text` that names a table `module` does not own.
    static func foreignTables(in text: String, module: String, file: String, known: Set<String>, sql: Bool = false)
        -> [String]
    {
        var found: [String] = []
        for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let trimmed = line.drop { $0 == " " }
            if sql ? trimmed.hasPrefix("--") : (trimmed.hasPrefix("//") || trimmed.hasPrefix("*")) { continue }
            for table in tables(in: line, known: known).sorted() where owner(ofTable: table) != module {
                found.append("\(file):\(index + 1): \(table) (\(owner(ofTable: table))'s)")
            }
        }
        return found
    }

    /// Functions a line calls (`broker_x(`), whatever their file.
    static func calledFunctions(in line: Substring, known: Set<String>) -> Set<String> {
        Set(line.matches(of: #/\b(broker_[a-z0-9_]+)\(/#).map { String($0.output.1) }).intersection(known)
    }
}

@Suite("Source rules")
struct SourceRulesTests {
    @Test("SQL is written only in stores, Storage/ and the driver")
    func sqlOnlyInStores() throws {
        let sources = Repository.root.appendingPathComponent("Sources")
        let files = try #require(FileManager.default.enumerator(at: sources, includingPropertiesForKeys: nil))
            .compactMap { $0 as? URL }.filter { $0.pathExtension == "swift" }
        #expect(files.count > 50, "the source tree was not found")
        var outside: [String] = []
        for url in files {
            let relative = "Sources/" + url.path.dropFirst(sources.path.count + 1)
            guard !SQLHome.allows(relative) else { continue }
            outside += SQLHome.statements(in: try String(contentsOf: url, encoding: .utf8), file: relative)
        }
        #expect(outside.isEmpty, "SQL outside a store:\n\(outside.joined(separator: "\n"))")
    }

    /// Swift files that may hold SQL, by module: `Sources/<module>/…`.
    static func storeFiles() throws -> [(module: String, path: String, text: String)] {
        let sources = Repository.root.appendingPathComponent("Sources")
        let files = try #require(FileManager.default.enumerator(at: sources, includingPropertiesForKeys: nil))
            .compactMap { $0 as? URL }.filter { $0.pathExtension == "swift" }
        return try files.compactMap { url in
            let relative = "Sources/" + url.path.dropFirst(sources.path.count + 1)
            guard SQLHome.allows(relative) else { return nil }
            let module = String(relative.split(separator: "/")[1])
            // The driver and the benchmark's seeding belong to no module's tables.
            guard module != "PostgresClient" && module != "broker-bench" else { return nil }
            return (module, relative, try String(contentsOf: url, encoding: .utf8))
        }
    }

    static func sqlFiles(_ folder: String) throws -> [(name: String, text: String)] {
        let directory = Repository.root.appendingPathComponent(folder)
        return try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".sql") }.sorted()
            .map { ($0, try String(contentsOf: directory.appendingPathComponent($0), encoding: .utf8)) }
    }

    @Test("every table has one owning module: a store names only its own module's tables, a SQL function only its owner's")
    func tablesHaveOneOwner() throws {
        let tables = TableOwners.tables(migrations: try Self.sqlFiles("sql").map(\.text))
        #expect(tables.count > 20 && tables.contains("oidc_grants") && tables.contains("console_sessions"))
        var foreign: [String] = []
        for file in try Self.storeFiles() {
            foreign += TableOwners.foreignTables(in: file.text, module: file.module, file: file.path, known: tables)
        }
        let functions = try Self.sqlFiles("sql/functions")
        let functionNames = Set(functions.map { String($0.name.dropLast(".sql".count)) })
        for function in functions {
            let name = String(function.name.dropLast(".sql".count))
            // The trigger's own table is its declaration (checked below), not its body.
            let body = function.text.split(separator: "\n", omittingEmptySubsequences: false)
                .filter { !$0.contains("CREATE TRIGGER") && !$0.contains("pg_trigger") }.joined(separator: "\n")
            foreign += TableOwners.foreignTables(
                in: body, module: TableOwners.owner(ofFunction: name), file: "sql/functions/\(function.name)", known: tables,
                sql: true)
        }
        // A store calls only its own module's functions.
        for file in try Self.storeFiles() {
            for (index, line) in file.text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                for called in TableOwners.calledFunctions(in: line, known: functionNames)
                where TableOwners.owner(ofFunction: called) != file.module {
                    foreign.append("\(file.path):\(index + 1): calls \(called) (\(TableOwners.owner(ofFunction: called))'s)")
                }
            }
        }
        #expect(foreign.isEmpty, "a module reaches another module's tables:\n\(foreign.joined(separator: "\n"))")
    }

    @Test("a trigger that crosses a module line is named in the Swift of both modules")
    func crossingTriggersAreDeclared() throws {
        let tables = TableOwners.tables(migrations: try Self.sqlFiles("sql").map(\.text))
        let swift = try Self.storeFiles()
        var undeclared: [String] = []
        var crossing = 0
        for function in try Self.sqlFiles("sql/functions") {
            let owner = TableOwners.owner(ofFunction: String(function.name.dropLast(".sql".count)))
            for match in function.text.matches(of: #/CREATE TRIGGER ([a-z_0-9]+)[^;]*?\bON\s+([a-z_0-9]+)/#) {
                let (trigger, table) = (String(match.output.1), String(match.output.2))
                guard tables.contains(table), TableOwners.owner(ofTable: table) != owner else { continue }
                crossing += 1
                for module in [owner, TableOwners.owner(ofTable: table)]
                where !swift.contains(where: { $0.module == module && $0.text.contains(trigger) }) {
                    undeclared.append("\(trigger) (\(owner)'s, on \(table)): no store of \(module) names it")
                }
            }
        }
        #expect(crossing > 0, "broker_oidc_end_grants crosses from the provider onto outbox_events")
        #expect(undeclared.isEmpty, "\(undeclared.joined(separator: "\n"))")
    }

    @Test("the provider's services take typed values: only its HTTP/ folder and its front door import HTTPServer")
    func providerHTTPStaysInHTTP() throws {
        let folder = Repository.root.appendingPathComponent("Sources/OpenIDProvider")
        let files = try #require(FileManager.default.enumerator(at: folder, includingPropertiesForKeys: nil))
            .compactMap { $0 as? URL }.filter { $0.pathExtension == "swift" }
        #expect(files.count > 10)
        let speakingHTTP = try files.compactMap { url -> String? in
            let relative = String(url.path.dropFirst(folder.path.count + 1))
            // HTTP/ holds the routes; OpenIDProvider.swift registers them on the router.
            guard !relative.hasPrefix("HTTP/") && relative != "OpenIDProvider.swift" else { return nil }
            let text = try String(contentsOf: url, encoding: .utf8)
            return text.split(separator: "\n").contains { $0 == "import HTTPServer" } ? relative : nil
        }
        #expect(speakingHTTP.isEmpty, "HTTP outside HTTP/: \(speakingHTTP.sorted())")
    }

    @Test("the ownership rule sees a foreign table in a store, a function or a literal, and lets comments be")
    func ownershipRuleCatches() {
        let known: Set<String> = ["apple_identities", "oidc_grants", "console_sessions", "deletion_requests", "users"]
        let store = """
            // the grant's user (apple_identities), FROM users
            try pool.query("SELECT email FROM apple_identities i JOIN oidc_grants g ON g.user_id = i.user_id")
            try pool.query("DELETE FROM console_sessions WHERE expires_at < now()")
            static let table = DeliveryTable("deletion_requests")
            WITH ended AS (UPDATE oidc_grants SET ended_at = now()) DELETE FROM oidc_tokens t USING ended e
            """
        let found = TableOwners.foreignTables(in: store, module: "OpenIDProvider", file: "x", known: known)
        #expect(
            found == [
                "x:2: apple_identities (BrokerCore's)", "x:3: console_sessions (Console's)",
                "x:4: deletion_requests (BrokerCore's)",
            ])
        #expect(TableOwners.owner(ofFunction: "broker_oidc_end_grants") == "OpenIDProvider")
        #expect(TableOwners.calledFunctions(in: "SELECT broker_login($1) FROM x", known: ["broker_login"]) == ["broker_login"])
    }

    @Test("the rule sees a statement in a service and lets a store or a comment be")
    func ruleCatches() {
        #expect(!SQLHome.allows("Sources/BrokerCore/Login/RefreshTokenSweep.swift"))
        #expect(!SQLHome.allows("Sources/BrokerCore/HTTP/OperationsRoutes.swift"))
        #expect(SQLHome.allows("Sources/BrokerCore/Login/RefreshTokenStore.swift"))
        #expect(SQLHome.allows("Sources/BrokerCore/Storage/Migrations.swift"))
        #expect(SQLHome.allows("Sources/PostgresClient/PostgresConnection.swift"))
        let service = """
            // one UPDATE of two columns, FOR UPDATE SKIP LOCKED
            let due = try pool.query(
                \"""
                SELECT t.id FROM apple_tokens t
                \""")
            try pool.query("UPDATE apple_tokens t SET revoked_at = now()")
            try pool.query("DELETE FROM apple_notifications")
            try pool.query("INSERT INTO users (id) VALUES (1)")
            router.add(.delete, "/v1/users/{id}")
            """
        #expect(SQLHome.statements(in: service, file: "x").count == 4)
    }
}
