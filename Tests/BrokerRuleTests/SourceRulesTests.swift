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
