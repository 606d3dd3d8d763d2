import BrokerAPI
import BrokerCore
import Foundation
import HTTPClient
import ProcessRunner
import TestSupport
import Testing

/// The Grafana dashboard and the Prometheus alert rules in deploy/ against the metrics the
/// broker really serves, and the rules against promtool.
@Suite("Dashboard and alert rules", .offPool)
struct MonitoringTests {
    static let promtool = Repository.executable("promtool")
    static let promtoolMissing: Comment =
        "promtool is not installed (Debian package prometheus; scripts/bootstrap.sh test installs it)"

    @Test("with BROKER_METRICS_LISTEN, /metrics is served there and only there")
    func metricsListener() throws {
        let port = FreePort.next()
        let broker = try TestBroker(extra: ["BROKER_METRICS_LISTEN": "127.0.0.1:\(port)"])
        #expect(try broker.get("/metrics").status == 404)
        #expect(try broker.get("/healthz").status == 200)
        let scraped = try broker.client.send(.init(url: "http://127.0.0.1:\(port)/metrics"))
        #expect(scraped.status == 200)
        #expect(scraped.bodyText.contains("http_requests_total{route=\"/healthz\",method=\"GET\",status=\"200\"} 1"))
        #expect(
            try broker.client.send(.init(url: "http://127.0.0.1:\(port)/healthz")).status == 404,
            "nothing else on the metrics port")
        #expect(broker.application.metricsPort == UInt16(port))
    }

    @Test("/metrics says which build runs (version and commit) and the usual process_* figures")
    func buildAndProcessMetrics() throws {
        let broker = try TestBroker()
        let text = try broker.get("/metrics").bodyText
        let head = try ChildProcess.run("/usr/bin/git", ["-C", Repository.root.path, "rev-parse", "HEAD"])
        let commit = head.status == 0 ? String(head.output.prefix(12)) : "unknown"
        #expect(
            text.contains("appleid_broker_build_info{version=\"\(BrokerApplication.version)\",commit=\"\(commit)\"} 1"),
            "\(commit)")
        func value(_ name: String) -> Double? {
            text.split(separator: "\n").first { $0.hasPrefix(name + " ") }.flatMap { Double($0.split(separator: " ")[1]) }
        }
        #expect((value("process_resident_memory_bytes") ?? 0) > 1_000_000)
        #expect((value("process_open_fds") ?? 0) > 3)
        #expect((value("process_threads") ?? 0) > 4)
        #expect((value("process_cpu_seconds_total") ?? 0) > 0)
        #expect((value("process_max_fds") ?? 0) >= (value("process_open_fds") ?? 0))
        let started = value("process_start_time_seconds") ?? 0
        #expect(abs(started - Date().timeIntervalSince1970) < 3600, "the test process started within the hour")
    }

    @Test("the Grafana dashboard is well-formed and every panel's metric is served on /metrics")
    func dashboard() throws {
        let dashboard = try #require(
            try JSONSerialization.jsonObject(with: Data(Repository.text("deploy/grafana/appleid-broker.json").utf8))
                as? [String: Any])
        #expect(dashboard["uid"] as? String == "appleid-broker")
        #expect(dashboard["schemaVersion"] is Int)
        #expect(dashboard["title"] is String)
        let panels = try #require(dashboard["panels"] as? [[String: Any]])
        let served = try Self.servedMetrics()
        var ids = Set<Int>()
        var occupied = Set<[Int]>()
        var expressions: [String] = []
        for panel in panels {
            let id = try #require(panel["id"] as? Int)
            #expect(ids.insert(id).inserted, "panel id \(id) is used twice")
            let grid = try #require(panel["gridPos"] as? [String: Int])
            let (x, y, w, h) = (grid["x"] ?? -1, grid["y"] ?? -1, grid["w"] ?? 0, grid["h"] ?? 0)
            #expect(x >= 0 && w > 0 && x + w <= 24 && h > 0, "panel \(id) lies outside Grafana's 24-column grid")
            for column in x..<(x + max(w, 0)) {
                for row in y..<(y + max(h, 0)) {
                    #expect(occupied.insert([column, row]).inserted, "panel \(id) overlaps another at \(column),\(row)")
                }
            }
            guard panel["type"] as? String != "row" else { continue }
            #expect(["timeseries", "stat", "gauge", "table"].contains(panel["type"] as? String ?? ""))
            let targets = try #require(panel["targets"] as? [[String: Any]])
            #expect(!targets.isEmpty, "panel \(id) draws nothing")
            for target in targets {
                let expression = try #require(target["expr"] as? String)
                expressions.append(expression)
                let names = Self.metricNames(in: expression)
                #expect(!names.isEmpty, "panel \(id): no metric in \(expression)")
                #expect(
                    names.isSubset(of: served),
                    "panel \(id) \(panel["title"] ?? ""): not on /metrics: \(names.subtracting(served).sorted())")
            }
        }
        #expect(panels.count >= 20)
        // In a Prometheus shared with other services (http_requests_total is a common name),
        // every query keeps to the broker's jobs, and "All" means the broker's jobs only.
        for expression in expressions {
            for selector in expression.matches(of: /([a-z_:]+)\{([^}]*)\}/) {
                #expect(selector.2.contains("job=~\"$job\""), "not limited to the broker's jobs: \(expression)")
            }
        }
        // The job variable's query names a metric too.
        let variables = try #require((dashboard["templating"] as? [String: Any])?["list"] as? [[String: Any]])
        for case let definition as String in variables.map({ $0["definition"] }) {
            // label_values(<metric>, <label>)
            let metric = definition.firstMatch(of: /label_values\(([a-z_:]+),/).map { String($0.1) }
            #expect(metric.map(served.contains) == true, "variable query: \(definition)")
        }
        let job = try #require(variables.first { $0["name"] as? String == "job" })
        #expect(job["definition"] as? String == "label_values(appleid_broker_build_info, job)")
        #expect(job["allValue"] == nil, "All must stay the broker's own jobs, not .*")

        // Every expression parses as PromQL: promtool checks them as recording rules.
        guard let promtool = Self.promtool else { return }
        let rules = expressions.enumerated().map { index, expression in
            [
                "record": "dashboard:panel_\(index)",
                "expr": expression.replacingOccurrences(of: "$__rate_interval", with: "5m")
                    .replacingOccurrences(of: "$job", with: ".*"),
            ]
        }
        let file = TestFiles.path("dashboard-rules", suffix: ".json")
        // YAML is a superset of JSON (bar the "\\/" escape), so promtool reads this as a rule file.
        try JSONSerialization.data(
            withJSONObject: ["groups": [["name": "dashboard", "rules": rules]]], options: .withoutEscapingSlashes
        ).write(to: URL(fileURLWithPath: file))
        defer { try? FileManager.default.removeItem(atPath: file) }
        let check = try ChildProcess.run(promtool, ["check", "rules", file])
        #expect(check.status == 0, "\(check.output)")
    }

    @Test("every metric an alert rule names is served on /metrics")
    func alertMetrics() throws {
        let served = try Self.servedMetrics()
        let expressions = try Repository.text("deploy/prometheus/alerts.yml").split(separator: "\n").compactMap { line in
            line.trimmingCharacters(in: .whitespaces).hasPrefix("expr:")
                ? String(line.trimmingCharacters(in: .whitespaces).dropFirst("expr:".count)) : nil
        }
        #expect(expressions.count >= 6)
        for expression in expressions {
            let names = Self.metricNames(in: expression)
            #expect(
                !names.isEmpty && names.isSubset(of: served),
                "\(expression): not on /metrics: \(names.subtracting(served).sorted())")
        }
    }

    @Test("the alert rules are valid and fire as their unit tests say (promtool)", .enabled(if: promtool != nil, promtoolMissing))
    func alertRules() throws {
        let promtool = try #require(Self.promtool)
        let check = try ChildProcess.run(promtool, ["check", "rules", Repository.path("deploy/prometheus/alerts.yml")])
        #expect(check.status == 0, "\(check.output)")
        let unitTests = try ChildProcess.run(promtool, ["test", "rules", Repository.path("deploy/prometheus/alerts.test.yml")])
        #expect(unitTests.status == 0, "\(unitTests.output)")
        #expect(unitTests.output.contains("SUCCESS"))
    }

    /// Every series name a broker with all roles serves: the `# TYPE` families, and the
    /// `_bucket`/`_sum`/`_count` series of its histograms.
    static func servedMetrics() throws -> Set<String> {
        let broker = try TestBroker(roles: TestBroker.allRoles)
        let response = try broker.get("/metrics")
        #expect(response.status == 200)
        var names = Set<String>()
        for line in String(decoding: response.body, as: UTF8.self).split(separator: "\n") where line.hasPrefix("# TYPE ") {
            let fields = line.split(separator: " ")
            guard fields.count == 4 else { continue }
            names.insert(String(fields[2]))
            if fields[3] == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] { names.insert(fields[2] + suffix) }
            }
        }
        return names
    }

    /// The metric names a PromQL expression selects: identifiers left once label matchers,
    /// ranges, grouping clauses and strings are taken out, other than functions and keywords.
    static func metricNames(in expression: String) -> Set<String> {
        var text = expression
        for pattern in [
            #""[^"]*""#, #"\{[^}]*\}"#, #"\[[^\]]*\]"#, #"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"#,
        ] {
            text = text.replacingOccurrences(of: pattern, with: " ", options: .regularExpression)
        }
        let keywords: Set<String> = [
            "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right",
        ]
        let identifier = try! NSRegularExpression(pattern: #"(?<![\w.:$])([a-zA-Z_:][a-zA-Z0-9_:]*+)(?!\s*\()"#)
        var names = Set<String>()
        for match in identifier.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
            let name = String(text[Range(match.range(at: 1), in: text)!])
            if !keywords.contains(name) { names.insert(name) }
        }
        return names
    }
}
