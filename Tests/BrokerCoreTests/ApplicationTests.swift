import BrokerCore
import EmbeddedPostgres
import Foundation
import HTTPClient
import Observability
import ProcessRunner
import TestSupport
import Testing

@Suite("Service")
struct ApplicationTests {
    @Test("/healthz, /readyz and /metrics answer")
    func operations() throws {
        let broker = try TestBroker()
        #expect(try broker.get("/healthz").json["status"] as? String == "ok")
        let ready = try broker.get("/readyz")
        #expect(ready.status == 200)
        let metrics = try broker.get("/metrics")
        #expect(metrics.status == 200)
        #expect(metrics.header("content-type")?.hasPrefix("text/plain; version=0.0.4") == true)
        #expect(metrics.bodyText.contains(#"http_requests_total{route="/readyz",method="GET",status="200"} 1"#))
        #expect(metrics.bodyText.contains(#"db_pool_connections{state="max"} 16"#))
    }

    @Test("with PostgreSQL down, requests get 503 with Retry-After; the service recovers by itself")
    func databaseOutage() throws {
        let cluster = try TestPostgres.dedicatedCluster()
        defer { try? cluster.stop() }
        let broker = try TestBroker(database: cluster.connectionConfiguration)
        #expect(try broker.get("/readyz").status == 200)

        try cluster.stop()
        let down = try broker.get("/readyz")
        #expect(down.status == 503)
        #expect(down.header("retry-after") != nil)
        #expect(down.json["code"] as? String == "database_unavailable")

        try cluster.start()
        #expect(try broker.get("/readyz").status == 200)
    }

    @Test("logs are JSON lines and hold no API key")
    func logsAreSafe() throws {
        let broker = try TestBroker()
        let key = try broker.apiKey([.read])
        _ = try broker.get("/readyz", key: key)
        let lines = broker.logs.capturedLines
        #expect(!lines.isEmpty)
        for line in lines {
            #expect((try? JSONSerialization.jsonObject(with: Data(line.utf8))) is [String: Any])
            #expect(!line.contains(key))
        }
    }
}

@Suite("Command line")
struct CommandLineTests {
    @Test("api-keys create prints the key as the only line on stdout; list and revoke work")
    func apiKeys() throws {
        let environment = try TestEnvironment.variables(database: try TestPostgres.freshDatabase())
        let created = try BrokerExecutable.run(
            ["api-keys", "create", "--name", "backend", "--scopes", "login,read"], environment: environment)
        #expect(created.status == 0, "\(created.stderr)")
        let lines = created.stdout.split(separator: "\n")
        #expect(lines.count == 1)
        let key = String(lines[0])
        #expect(key.hasPrefix("abk_"))

        let listed = try BrokerExecutable.run(["api-keys", "list", "--json"], environment: environment)
        #expect(listed.status == 0)
        let keys = try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]]
        #expect(keys?.count == 1)
        #expect(keys?.first?["name"] as? String == "backend")
        #expect(!listed.stdout.contains(key))
        let id = try #require(keys?.first?["id"] as? String)

        #expect(try BrokerExecutable.run(["api-keys", "revoke", id], environment: environment).status == 0)
        #expect(try BrokerExecutable.run(["api-keys", "revoke", id], environment: environment).status == 1)
    }

    @Test("bad arguments and bad configuration exit 2 with a message")
    func usageErrors() throws {
        let environment = try TestEnvironment.variables(database: try TestPostgres.freshDatabase())
        let unknown = try BrokerExecutable.run(["frobnicate"], environment: environment)
        #expect(unknown.status == 2)
        #expect(unknown.stderr.contains("unknown command"))
        let badScope = try BrokerExecutable.run(["api-keys", "create", "--name", "x", "--scopes", "everything"], environment: environment)
        #expect(badScope.status == 2)
        var broken = environment
        broken["APPLE_CLIENT_IDS"] = ""
        broken["TOKEN_ENCRYPTION_KEY"] = "nope"
        let serve = try BrokerExecutable.run(["serve"], environment: broken)
        #expect(serve.status == 2)
        #expect(serve.stderr.contains("APPLE_CLIENT_IDS:"))
        #expect(serve.stderr.contains("TOKEN_ENCRYPTION_KEY:"))
    }

    @Test("serve stops gracefully on SIGTERM")
    func serveStopsOnSIGTERM() throws {
        var environment = try TestEnvironment.variables(database: try TestPostgres.freshDatabase())
        let port = 20_000 + Int.random(in: 0..<20_000)
        environment["BROKER_LISTEN"] = "127.0.0.1:\(port)"
        environment["BROKER_LOG_LEVEL"] = "notice"
        let log = NSTemporaryDirectory() + "abk-serve-\(UUID().uuidString).log"
        let process = try ChildProcess.start(BrokerExecutable.path, ["serve"], environment: environment, output: .file(log))
        defer { process.send(SIGKILL) }
        let client = CurlTransport()
        var ready = false
        for _ in 0..<200 {
            if (try? client.send(.init(url: "http://127.0.0.1:\(port)/readyz", timeout: .seconds(1))))?.status == 200 {
                ready = true
                break
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
        #expect(ready)
        process.send(SIGTERM)
        #expect(process.wait() == 0)
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        #expect(text.contains("appleid-broker stopped"))
    }
}
