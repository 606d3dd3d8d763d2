import Foundation
import Glibc
import HTTPClient
import ProcessRunner
import TestSupport
import Testing

/// Issue 29 item 9: the broker's own output and the embedded PostgreSQL's lifetime.
@Suite("Process hygiene", .offPool)
struct ProcessHygieneTests {
    /// `serve` against a fresh database on a free port, its stdout and stderr on `output`.
    static func serve(output: ChildProcess.Output, extra: [String: String] = [:]) throws -> (ChildProcess, Int) {
        let port = FreePort.next()
        let environment = try TestEnvironment.variables(
            database: try TestPostgres.freshDatabase(),
            extra: ["BROKER_LISTEN": "127.0.0.1:\(port)", "BROKER_LOG_LEVEL": "debug"].merging(extra) { $1 })
        let process = try ChildProcess.start(BrokerExecutable.path, ["serve"], environment: environment, output: output)
        return (process, port)
    }

    static func ready(_ port: Int, _ process: ChildProcess) -> Bool {
        let client = CurlTransport()
        for _ in 0..<600 where process.isRunning {
            if (try? client.send(.init(url: "http://127.0.0.1:\(port)/readyz", timeout: .seconds(1))))?.status == 200 {
                return true
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
        return false
    }

    /// Running, and not a zombie (an orphan's parent here may be a pid 1 that never reaps).
    static func alive(_ pid: pid_t) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return false }
        return !stat[stat.index(after: close)...].hasPrefix(" Z")
    }

    @Test("a broker whose stdout and stderr reader went away keeps serving, and counts the lines it dropped")
    func closedPipe() throws {
        var ends: [Int32] = [0, 0]
        #expect(pipe(&ends) == 0)
        // Close-on-exec, or a child another test spawns meanwhile would keep a reader alive.
        _ = fcntl(ends[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(ends[1], F_SETFD, FD_CLOEXEC)
        let (broker, port) = try Self.serve(output: .descriptor(ends[1]))
        defer { broker.send(SIGKILL) }
        // Nobody reads: every write of the broker's now fails with EPIPE (SIGPIPE before).
        close(ends[1])
        close(ends[0])
        #expect(Self.ready(port, broker), "the broker died (status \(broker.wait()))")
        let client = CurlTransport()
        for _ in 0..<5 {
            #expect(try client.send(.init(url: "http://127.0.0.1:\(port)/healthz")).status == 200)
        }
        let metrics = try client.send(.init(url: "http://127.0.0.1:\(port)/metrics")).bodyText
        let dropped = metrics.split(separator: "\n").first { $0.hasPrefix("broker_log_lines_dropped_total ") }
            .flatMap { Double($0.split(separator: " ")[1]) }
        #expect((dropped ?? 0) > 0, "\(metrics.prefix(300))")
        broker.send(SIGTERM)
        #expect(broker.wait() == 0)
    }

    @Test("a broker started with stdout and stderr closed keeps serving")
    func closedDescriptors() throws {
        let port = FreePort.next()
        let environment = try TestEnvironment.variables(
            database: try TestPostgres.freshDatabase(),
            extra: ["BROKER_LISTEN": "127.0.0.1:\(port)", "BROKER_LOG_LEVEL": "debug"])
        let broker = try ChildProcess.start(
            "/bin/sh", ["-c", "exec \"$0\" serve >&- 2>&-", BrokerExecutable.path], environment: environment, output: .null)
        defer { broker.send(SIGKILL) }
        #expect(Self.ready(port, broker), "the broker died (status \(broker.wait()))")
        let client = CurlTransport()
        #expect(try client.send(.init(url: "http://127.0.0.1:\(port)/healthz")).status == 200)
        broker.send(SIGTERM)
        #expect(broker.wait() == 0)
    }

    @Test("a broker killed with SIGKILL leaves no embedded PostgreSQL behind")
    func killedBrokerStopsItsCluster() throws {
        let (environment, dataDirectory) = try EmbeddedShutdownTests.embeddedEnvironment()
        defer { try? FileManager.default.removeItem(atPath: dataDirectory) }
        let (broker, _) = try EmbeddedShutdownTests.serve([], environment: environment, log: dataDirectory + "/serve.log")
        let postmaster = try #require(EmbeddedShutdownTests.postmaster(dataDirectory))
        // A CLI command meanwhile joins and leaves the cluster: the watchdog waits for it too.
        #expect(try BrokerExecutable.run(["api-keys", "list"], environment: environment).status == 0)
        broker.send(SIGKILL)
        _ = broker.wait()
        // About a second on an idle machine; generous for a loaded one (a shutdown checkpoint).
        let deadline = Date().addingTimeInterval(30)
        // The process itself, not its pid file: the file goes a moment before the process does.
        while Self.alive(postmaster) && Date() < deadline {
            Thread.sleep(forTimeInterval: 0.1)
        }
        #expect(!Self.alive(postmaster), "postmaster \(postmaster) outlived the killed broker")
        // The next start finds a stopped cluster and starts it again.
        let (again, _) = try EmbeddedShutdownTests.serve([], environment: environment, log: dataDirectory + "/again.log")
        #expect(EmbeddedShutdownTests.postmaster(dataDirectory) != nil)
        again.send(SIGTERM)
        #expect(again.wait() == 0)
    }
}
