import BrokerAPI
import BrokerCore
import Foundation
import HTTPClient
import HTTPServer
import Observability
import PostgresClient
import TestSupport
import Testing

@Suite("API keys", .offPool)
struct APIKeyTests {
    /// A server with one route per scope, guarded by the real authenticator.
    private func withGuardedServer(
        failures: RateLimiter = RateLimiter(rate: 0, burst: 1), _ body: (String, APIKeyStore, APIKeyAuthenticator) throws -> Void
    ) throws {
        let database = try TestPostgres.freshDatabase()
        try Migrations.apply(configuration: database, logger: Logger(label: "t", sink: .capturing()))
        let pool = PostgresPool(configuration: .init(connection: database, maximumConnections: 4))
        let store = APIKeyStore(pool: pool)
        let authenticator = APIKeyAuthenticator(store: store, failures: failures)
        var router = Router()
        for scope in Scope.allCases {
            router.get("/\(scope.rawValue)", authenticator.protect(scope) { _, key in .json(["key": key.id]) })
        }
        var configuration = HTTPServer.Configuration()
        configuration.listen = "127.0.0.1:0"
        configuration.accessLog = false
        let server = HTTPServer(
            configuration: configuration, router: router, logger: Logger(label: "t", sink: .capturing()),
            metrics: MetricsRegistry(), errorMapper: ProblemCatalog.problem(for:))
        try server.start()
        defer { server.shutdown() }
        try body("http://127.0.0.1:\(server.port)", store, authenticator)
    }

    @Test("no key, a malformed key, a wrong secret or a revoked key get 401; the wrong scope 403; the right one 200")
    func authorization() throws {
        try withGuardedServer { base, store, authenticator in
            let client = CurlTransport()
            func get(_ path: String, _ authorization: String?) throws -> HTTPClientResponse {
                try client.send(.init(url: base + path, headers: authorization.map { [("Authorization", $0)] } ?? []))
            }
            let (key, secret) = try store.create(name: "backend", scopes: [.login, .read])

            let missing = try get("/login", nil)
            #expect(missing.status == 401)
            #expect(missing.json["code"] as? String == "unauthorized")
            #expect(missing.header("www-authenticate")?.hasPrefix("Bearer") == true)
            #expect(try get("/login", "Basic dXNlcjpwYXNz").status == 401)
            #expect(try get("/login", "Bearer not-a-key").status == 401)
            var tampered = Array(secret)
            tampered[tampered.count - 1] = tampered.last == "A" ? "B" : "A"
            #expect(try get("/login", "Bearer " + String(tampered)).status == 401)
            #expect(try get("/login", "Bearer abk_zzzzzzzzzzzz_" + String(secret.suffix(43))).status == 401)

            let ok = try get("/login", "Bearer \(secret)")
            #expect(ok.status == 200)
            #expect(ok.json["key"] as? String == key.id)
            #expect(try get("/read", "Bearer \(secret)").status == 200)

            let forbidden = try get("/compliance", "Bearer \(secret)")
            #expect(forbidden.status == 403)
            #expect(forbidden.json["code"] as? String == "insufficient_scope")

            #expect(try store.revoke(id: key.id))
            authenticator.invalidate()  // What the NOTIFY listener does in the service.
            #expect(try get("/login", "Bearer \(secret)").status == 401)
            #expect(try store.revoke(id: key.id) == false)
        }
    }

    @Test("guessing keys from one address: 401 for a burst, then 429; a stored valid key, even one never seen, is not held up")
    func failedAuthenticationLimit() throws {
        try withGuardedServer(failures: RateLimiter(rate: 0.01, burst: 30)) { base, store, authenticator in
            let client = CurlTransport()
            let (_, secret) = try store.create(name: "backend", scopes: [.login])
            #expect(try client.send(.init(url: base + "/login", headers: [("Authorization", "Bearer \(secret)")])).status == 200)
            func guess() throws -> Int {
                let id = String((0..<12).map { _ in "abcdefghijklmnopqrstuvwxyz0123456789".randomElement()! })
                let guessed = "abk_\(id)_" + String(repeating: "x", count: 43)
                return try client.send(.init(url: base + "/login", headers: [("Authorization", "Bearer \(guessed)")])).status
            }
            let statuses = try (0..<60).map { _ in try guess() }
            #expect(statuses.prefix(30).allSatisfy { $0 == 401 })
            #expect(statuses.suffix(30).allSatisfy { $0 == 429 }, "\(statuses)")
            // Behind a proxy every client shares the address: a key this process has not looked
            // up yet (a fresh replica's every key) is looked up, never refused for the guesses.
            let (_, fresh) = try store.create(name: "new", scopes: [.login])
            #expect(try client.send(.init(url: base + "/login", headers: [("Authorization", "Bearer \(fresh)")])).status == 200)
            authenticator.invalidate()  // a revocation elsewhere: the working key is read again, not refused
            #expect(try client.send(.init(url: base + "/login", headers: [("Authorization", "Bearer \(secret)")])).status == 200)
        }
    }

    @Test("only a hash of the key is stored")
    func storesHashOnly() throws {
        try withGuardedServer { _, store, _ in
            let (key, secret) = try store.create(name: "n", scopes: [.admin])
            let rows = try store.list()
            #expect(rows.map(\.id) == [key.id])
            #expect(rows.first?.scopes == [.admin])
            #expect(!secret.isEmpty && secret.hasPrefix("abk_\(key.id)_"))
        }
        let database = try TestPostgres.freshDatabase()
        try Migrations.apply(configuration: database, logger: Logger(label: "t", sink: .capturing()))
        let pool = PostgresPool(configuration: .init(connection: database, maximumConnections: 2))
        let (_, secret) = try APIKeyStore(pool: pool).create(name: "n", scopes: [.login])
        let dump = try pool.query("SELECT row_to_json(api_keys)::text FROM api_keys").single().decode(String.self, 0)
        #expect(!dump.contains(String(secret.suffix(43))))
    }
}
