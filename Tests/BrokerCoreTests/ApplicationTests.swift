import BrokerAPI
import BrokerCore
import CommandArguments
import EmbeddedPostgres
import Foundation
import HTTPClient
import Observability
import ProcessRunner
import TestSupport
import Testing

@Suite("Service", .offPool)
struct ApplicationTests {
    @Test("/healthz, /readyz and /metrics answer")
    func operations() throws {
        let broker = try TestBroker(roles: TestBroker.allRoles)
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
        let broker = try TestBroker(database: cluster.connectionConfiguration, roles: TestBroker.allRoles)
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
        let broker = try TestBroker(roles: TestBroker.allRoles)
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

@Suite("Command line", .offPool)
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
        let badScope = try BrokerExecutable.run(
            ["api-keys", "create", "--name", "x", "--scopes", "everything"], environment: environment)
        #expect(badScope.status == 2)
        var broken = environment
        broken["APPLE_CLIENT_IDS"] = ""
        broken["TOKEN_ENCRYPTION_KEY"] = "nope"
        let serve = try BrokerExecutable.run(["serve"], environment: broken)
        #expect(serve.status == 2)
        #expect(serve.stderr.contains("APPLE_CLIENT_IDS:"))
        #expect(serve.stderr.contains("TOKEN_ENCRYPTION_KEY:"))
        // Two client ids and no APPLE_APP_GROUPS: the broker does not guess their grouping at
        // Apple (protocol reference §12.6); it refuses to start and names the variable.
        var ungrouped = environment
        ungrouped["APPLE_APP_GROUPS"] = nil
        // A second problem keeps a build that would start anyway from serving forever here.
        ungrouped["BROKER_DB_POOL_SIZE"] = "0"
        let refused = try BrokerExecutable.run(["serve"], environment: ungrouped)
        #expect(refused.status == 2)
        #expect(refused.stderr.contains("APPLE_APP_GROUPS: missing"), "\(refused.stderr)")
        #expect(refused.stderr.contains("APPLE_APP_GROUPS='com.example.app=com.example.web'"), "\(refused.stderr)")
    }

    /// The commands in docs/command-line.md's synopsis: each `appleid-broker GROUP a|b …` line
    /// (continuation lines are indented) gives GROUP alone, or GROUP with each alternative that
    /// starts with a lowercase word (`deletions list [--json] | retry ID`); an alternative inside
    /// an option (`(--user-id ID | --apple-sub SUB)`) starts with a dash and is not a command.
    static func documentedCommands() throws -> Set<[String]> {
        let text = try Repository.text("docs/command-line.md")
        let block = try #require(text.components(separatedBy: "```").dropFirst().first, "the synopsis block")
        func isWord<S: StringProtocol>(_ word: S) -> Bool {
            !word.isEmpty && !word.hasPrefix("-") && word.allSatisfy { $0.isLowercase || $0 == "-" }
        }
        var commands: Set<[String]> = []
        for line in block.split(separator: "\n") where line.hasPrefix("appleid-broker ") {
            let words = line.dropFirst("appleid-broker ".count).split(separator: " ", maxSplits: 1).map(String.init)
            let group = words[0]
            let alternatives = (words.count > 1 ? words[1] : "").split(separator: "|").map {
                $0.trimmingCharacters(in: .whitespaces).split(separator: " ").first.map(String.init) ?? ""
            }
            if let first = alternatives.first, isWord(first) {
                for alternative in alternatives where isWord(alternative) { commands.insert([group, alternative]) }
            } else {
                commands.insert([group])
            }
        }
        return commands
    }

    @Test("every command refuses an option it does not know: exit 2, which option, the command's usage line")
    func unknownOptionsRefused() throws {
        let environment = try TestEnvironment.variables(database: try TestPostgres.freshDatabase())
        // Every command the usage text lists: its words are the leading lowercase ones of
        // each command line (`  api-keys create --name NAME …`), before its summary.
        let usage = try BrokerExecutable.run(["--help"], environment: environment).stdout
        let commands = usage.split(separator: "\n").filter { $0.hasPrefix("  ") && !$0.hasPrefix("   ") }.map { line in
            let synopsis = line.dropFirst(2).components(separatedBy: "  ")[0]
            return synopsis.split(separator: " ").prefix { word in
                word.allSatisfy { $0.isLowercase || $0 == "-" } && !word.hasPrefix("-")
            }
            .map(String.init)
        }
        // Exactly the commands docs/command-line.md documents (the public contract), so a
        // dropped group and an undocumented command are both caught, without a count to bump.
        let documented = try Self.documentedCommands()
        #expect(
            Set(commands) == documented,
            "usage only: \(Set(commands).subtracting(documented)); docs only: \(documented.subtracting(commands))")
        #expect(commands.count == documented.count, "a command listed twice: \(commands)")
        #expect(
            commands.contains(["api-keys", "create"]) && commands.contains(["serve"]) && commands.contains(["reencrypt"])
                && commands.contains(["console", "link"]) && commands.contains(["oidc-resource-servers", "create"]))
        for words in commands {
            for extra in [["--no-such-option", "x"], ["--no-such-flag"], ["--no-such-option=x"]] {
                let result = try BrokerExecutable.run(words + extra, environment: environment)
                let name = words.joined(separator: " ")
                #expect(result.status == 2, "\(name) \(extra): \(result.stderr)")
                #expect(
                    result.stderr.contains("\(name): unknown option \(extra[0].split(separator: "=")[0])"), "\(result.stderr)")
                #expect(result.stderr.contains("usage: appleid-broker \(name)"), "\(result.stderr)")
                #expect(result.stdout.isEmpty)
            }
        }
        // A client id the broker does not accept: no key is made.
        let limited = try BrokerExecutable.run(
            ["api-keys", "create", "--name", "x", "--scopes", "read", "--client-ids", "com.example.other"],
            environment: environment)
        #expect(limited.status == 2)
        #expect(limited.stderr.contains("com.example.other is not one of APPLE_CLIENT_IDS"), "\(limited.stderr)")
        let listed = try BrokerExecutable.run(["api-keys", "list", "--json"], environment: environment)
        #expect((try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [Any])?.isEmpty == true)
        // A value missing, a flag given one, a stray operand.
        let missing = try BrokerExecutable.run(["api-keys", "create", "--scopes", "read", "--name"], environment: environment)
        #expect(missing.status == 2 && missing.stderr.contains("option --name needs a value"))
        let flagValue = try BrokerExecutable.run(["api-keys", "list", "--json=yes"], environment: environment)
        #expect(flagValue.status == 2 && flagValue.stderr.contains("option --json takes no value"))
        let stray = try BrokerExecutable.run(["api-keys", "revoke", "a", "b"], environment: environment)
        #expect(stray.status == 2 && stray.stderr.contains("unexpected argument 'b'"))
    }

    @Test("--version prints the version; a command group alone lists its commands")
    func versionAndGroups() throws {
        let environment = try TestEnvironment.variables(database: try TestPostgres.freshDatabase())
        for arguments in [["--version"], ["version"]] {
            let version = try BrokerExecutable.run(arguments, environment: environment)
            #expect(version.status == 0)
            #expect(version.stdout == "appleid-broker \(BrokerApplication.version)\n")
        }
        let group = try BrokerExecutable.run(["api-keys"], environment: environment)
        #expect(group.status == 0, "\(group.stderr)")
        for subcommand in ["create", "list", "revoke"] {
            #expect(group.stdout.contains("appleid-broker api-keys \(subcommand)"))
        }
        let unknown = try BrokerExecutable.run(["api-keys", "frob"], environment: environment)
        #expect(unknown.status == 2 && unknown.stderr.contains("unknown api-keys command 'frob'"))
        let help = try BrokerExecutable.run(["--help"], environment: environment)
        #expect(help.status == 0 && help.stdout.contains("healthcheck"))
    }

    @Test("serve stops gracefully on SIGTERM")
    func serveStopsOnSIGTERM() throws {
        var environment = try TestEnvironment.variables(database: try TestPostgres.freshDatabase())
        let port = FreePort.next()
        environment["BROKER_LISTEN"] = "127.0.0.1:\(port)"
        environment["BROKER_LOG_LEVEL"] = "notice"
        let log = TestFiles.path("serve", suffix: ".log")
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
        // The container healthcheck: 0 while /readyz answers 200, from BROKER_LISTEN alone
        // (a wildcard address is asked on loopback).
        let healthy = try BrokerExecutable.run(["healthcheck"], environment: ["BROKER_LISTEN": "0.0.0.0:\(port)"])
        #expect(healthy.status == 0, "\(healthy.stderr)")
        process.send(SIGTERM)
        #expect(process.wait() == 0)
        let stopped = try BrokerExecutable.run(["healthcheck"], environment: ["BROKER_LISTEN": "127.0.0.1:\(port)"])
        #expect(stopped.status == 1)
        #expect(stopped.stderr.contains("unhealthy"))
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        #expect(text.contains("appleid-broker stopped"))
    }
}

/// `serve` on the embedded cluster (no `DATABASE_URL`): stopping the broker stops the cluster
/// unless another process still uses it, and then whoever ends last stops it.
@Suite("Embedded PostgreSQL on shutdown", .offPool)
struct EmbeddedShutdownTests {
    /// A data directory the cluster's account can reach, and the environment to use it.
    static func embeddedEnvironment() throws -> (environment: [String: String], dataDirectory: String) {
        let dataDirectory = "/tmp/abk-embedded-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dataDirectory, withIntermediateDirectories: true)
        chmod(dataDirectory, 0o755)
        var environment = try TestEnvironment.variables(database: try TestPostgres.freshDatabase())
        environment["DATABASE_URL"] = nil
        environment["BROKER_DATA_DIR"] = dataDirectory
        environment["BROKER_LOG_LEVEL"] = "notice"
        return (environment, dataDirectory)
    }

    /// The postmaster's pid while it runs, from its pid file.
    static func postmaster(_ dataDirectory: String) -> pid_t? {
        guard let text = try? String(contentsOfFile: dataDirectory + "/postgres/postmaster.pid", encoding: .utf8),
            let pid = text.split(separator: "\n").first.flatMap({ pid_t($0) }), kill(pid, 0) == 0
        else { return nil }
        return pid
    }

    /// Starts `serve` with these arguments on a free port; returns it once /readyz answers 200.
    static func serve(
        _ arguments: [String], environment: [String: String], log: String
    ) throws -> (process: ChildProcess, port: Int) {
        var environment = environment
        let port = FreePort.next()
        environment["BROKER_LISTEN"] = "127.0.0.1:\(port)"
        let process = try ChildProcess.start(
            BrokerExecutable.path, ["serve"] + arguments, environment: environment, output: .file(log))
        let client = CurlTransport()
        // A deadline, not a count of tries: initdb and the migrations take what the machine gives
        // them (over 30 s when make test's lanes share two cores with other work).
        let deadline = ContinuousClock.now + .seconds(180)
        while ContinuousClock.now < deadline {
            if (try? client.send(.init(url: "http://127.0.0.1:\(port)/readyz", timeout: .seconds(1))))?.status == 200 {
                return (process, port)
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
        process.send(SIGKILL)
        throw TestFailure("serve never became ready: \((try? String(contentsOfFile: log, encoding: .utf8)) ?? "")")
    }

    struct TestFailure: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    @Test("SIGTERM stops the cluster after every role opened its connections (listener, pool, dispatcher)")
    func stopsItsCluster() throws {
        let (environment, dataDirectory) = try Self.embeddedEnvironment()
        defer { try? FileManager.default.removeItem(atPath: dataDirectory) }
        // Three rounds on one data directory: the old shutdown lost the race now and then.
        for round in 1...3 {
            let log = dataDirectory + "/serve-\(round).log"
            let (broker, port) = try Self.serve([], environment: environment, log: log)
            defer { broker.send(SIGKILL) }
            let postmaster = try #require(Self.postmaster(dataDirectory))
            // Every role at work: a key made and revoked by the CLI (a NOTIFY the listener gets),
            // a webhook subscription (the dispatcher), API calls (the pool).
            let created = try BrokerExecutable.run(
                ["api-keys", "create", "--name", "r\(round)", "--scopes", "read,events,admin"], environment: environment)
            #expect(created.status == 0, "\(created.stderr)")
            let key = created.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            let client = CurlTransport()
            let subscribed = try client.send(
                .init(
                    method: "POST", url: "http://127.0.0.1:\(port)/v1/webhook-subscriptions",
                    headers: [("Authorization", "Bearer \(key)"), ("Content-Type", "application/json")],
                    body: Array(#"{"url":"http://127.0.0.1:9/hook","topics":["*"]}"#.utf8)))
            #expect(subscribed.status == 201, "\(subscribed.bodyText)")
            let other = try BrokerExecutable.run(
                ["api-keys", "create", "--name", "gone", "--scopes", "read"], environment: environment)
            let listed = try BrokerExecutable.run(["api-keys", "list", "--json"], environment: environment)
            let keys = try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]] ?? []
            if let id = keys.first(where: { $0["name"] as? String == "gone" })?["id"] as? String {
                #expect(try BrokerExecutable.run(["api-keys", "revoke", id], environment: environment).status == 0)
            }
            #expect(other.status == 0)
            // The CLI runs above found the broker connected: they left the cluster running.
            #expect(Self.postmaster(dataDirectory) == postmaster)

            broker.send(SIGTERM)
            #expect(broker.wait() == 0)
            let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            #expect(!text.contains("leaving the embedded PostgreSQL running"), "round \(round): \(text)")
            #expect(Self.postmaster(dataDirectory) == nil, "round \(round): postmaster \(postmaster) still running")
        }
    }

    @Test("a start that fails (its port taken) stops what it started, the embedded cluster included")
    func failedStartStopsTheCluster() throws {
        var (environment, dataDirectory) = try Self.embeddedEnvironment()
        defer { try? FileManager.default.removeItem(atPath: dataDirectory) }
        let (holder, _) = try Self.serve([], environment: environment, log: dataDirectory + "/holder.log")
        holder.send(SIGTERM)
        #expect(holder.wait() == 0)
        #expect(Self.postmaster(dataDirectory) == nil)
        // Something else takes a port; the broker starts its cluster, then cannot listen. The
        // port is the kernel's pick, held from the start: a port looked up free and bound later
        // can be taken in between by a test running beside this one.
        let taken = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(taken) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(taken, $0, length) == 0 && getsockname(taken, $0, &length) == 0
            }
        }
        #expect(bound && listen(taken, 1) == 0)
        environment["BROKER_LISTEN"] = "127.0.0.1:\(UInt16(bigEndian: address.sin_port))"
        let log = dataDirectory + "/failed.log"
        let failed = try ChildProcess.start(BrokerExecutable.path, ["serve"], environment: environment, output: .file(log))
        #expect(failed.wait() == 1)
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        #expect(text.contains("could not start") && text.contains("\"part\":\"http\""), "\(text)")
        #expect(Self.postmaster(dataDirectory) == nil, "a failed start left the embedded PostgreSQL running: \(text)")
    }

    @Test("another process on the cluster keeps it running; the one that ends last stops it")
    func lastOneStopsIt() throws {
        let (environment, dataDirectory) = try Self.embeddedEnvironment()
        defer { try? FileManager.default.removeItem(atPath: dataDirectory) }
        let (first, _) = try Self.serve([], environment: environment, log: dataDirectory + "/first.log")
        defer { first.send(SIGKILL) }
        let postmaster = try #require(Self.postmaster(dataDirectory))
        // A second command on the same cluster, holding its connections: a sweep-only worker.
        let (second, _) = try Self.serve(["--roles", "sweep"], environment: environment, log: dataDirectory + "/second.log")
        defer { second.send(SIGKILL) }

        first.send(SIGTERM)
        #expect(first.wait() == 0)
        let firstLog = (try? String(contentsOfFile: dataDirectory + "/first.log", encoding: .utf8)) ?? ""
        #expect(firstLog.contains("leaving the embedded PostgreSQL running"))
        #expect(Self.postmaster(dataDirectory) == postmaster)

        second.send(SIGTERM)
        #expect(second.wait() == 0)
        #expect(Self.postmaster(dataDirectory) == nil, "the last process left postmaster \(postmaster) running")
    }
}
