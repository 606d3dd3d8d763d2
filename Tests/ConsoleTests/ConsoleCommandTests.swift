import BrokerCore
import Console
import Foundation
import HTTPClient
import PostgresClient
import ProcessRunner
import TestSupport
import Testing

/// `appleid-broker console link` and the console's settings.
@Suite("Console command line and settings", .offPool)
struct ConsoleCommandTests {
    /// The `appleid-broker` executable built beside this test binary.
    static var executable: String {
        let binary = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var directory = (binary as NSString).deletingLastPathComponent
        if directory.hasSuffix(".xctest") { directory = (directory as NSString).deletingLastPathComponent }
        return directory + "/appleid-broker"
    }

    @Test("console link prints a single-use URL under BROKER_CONSOLE_URL that signs in once with the role asked for")
    func link() throws {
        let broker = try ConsoleBroker()
        var environment = broker.environment
        environment["BROKER_CONSOLE_LISTEN"] = "127.0.0.1:\(broker.console.port)"
        environment["BROKER_CONSOLE_URL"] = "https://console.example"
        environment["BROKER_LOG_LEVEL"] = "error"
        let result = try ChildProcess.run(
            Self.executable, ["console", "link", "--operator", "carol", "--role", "compliance", "--ttl", "15m"],
            environment: environment)
        #expect(result.status == 0, "\(result.output)")
        let url = try #require(result.output.split(separator: "\n").last.map(String.init))
        #expect(url.hasPrefix("https://console.example/link?token="))
        let token = String(url.dropFirst("https://console.example/link?token=".count))
        #expect(
            try broker.count(
                "SELECT count(*) FROM console_links WHERE expires_at BETWEEN now() + interval '14 minutes' AND now() + interval '16 minutes'"
            ) == 1)
        let signedIn = try broker.post("/link", form: [("token", token)])
        #expect(signedIn.status == 303)
        let cookie = try #require(ConsoleBroker.sessionCookie(signedIn))
        #expect(try broker.get("/", cookie: cookie).bodyText.contains("carol (compliance)"))
        #expect(try broker.post("/link", form: [("token", token)]).status == 403)
        #expect(
            try broker.count(
                "SELECT count(*) FROM audit_log WHERE action = 'console.link_created' AND actor = 'cli' AND subject = 'console:carol'"
            ) == 1)

        for bad in [["--role", "root"], ["--role", "viewer", "--ttl", "2d"], ["--role", "viewer", "--ttl", "30s"]] {
            let refused = try ChildProcess.run(
                Self.executable, ["console", "link", "--operator", "x"] + bad, environment: environment)
            #expect(refused.status == 2, "\(bad)")
        }
        environment["BROKER_CONSOLE_LISTEN"] = nil
        environment["BROKER_CONSOLE_URL"] = nil
        #expect(
            try ChildProcess.run(
                Self.executable, ["console", "link", "--operator", "x", "--role", "viewer"], environment: environment
            ).status == 2)
    }

    @Test("console end-sessions ends every live session of an operator at once, audited; others keep theirs")
    func endSessions() throws {
        let broker = try ConsoleBroker()
        let first = try broker.signIn(.admin, operator: "erin")
        let second = try broker.signIn(.viewer, operator: "erin")
        let other = try broker.signIn(.viewer, operator: "frank")
        var environment = broker.environment
        environment["BROKER_LOG_LEVEL"] = "error"
        let result = try ChildProcess.run(
            Self.executable, ["console", "end-sessions", "--operator", "erin"], environment: environment)
        #expect(result.status == 0, "\(result.output)")
        #expect(result.output.contains("2 session(s) of erin ended"))
        for cookie in [first, second] { #expect(try broker.get("/", cookie: cookie).status == 303) }
        #expect(try broker.get("/", cookie: other).status == 200)
        #expect(
            try broker.count(
                "SELECT count(*) FROM audit_log WHERE action = 'console.sessions_ended' AND actor = 'cli' AND subject = 'console:erin' AND outcome = 'succeeded'"
            ) == 1)
        #expect(try ChildProcess.run(Self.executable, ["console", "end-sessions"], environment: environment).status == 2)
    }

    @Test("console link --role with several roles signs in once with all of them (make run's demo operator)")
    func linkWithSeveralRoles() throws {
        let broker = try ConsoleBroker()
        var environment = broker.environment
        environment["BROKER_CONSOLE_LISTEN"] = "127.0.0.1:\(broker.console.port)"
        environment["BROKER_LOG_LEVEL"] = "error"
        let result = try ChildProcess.run(
            Self.executable, ["console", "link", "--operator", "demo", "--role", "admin,viewer,compliance,operator"],
            environment: environment)
        #expect(result.status == 0, "\(result.output)")
        let url = try #require(result.output.split(separator: "\n").last.map(String.init))
        let token = try #require(url.split(separator: "token=").last.map(String.init))
        #expect(try broker.count("SELECT count(*) FROM console_links WHERE operator = 'demo' AND used_at IS NULL") == 4)
        let signedIn = try broker.post("/link", form: [("token", token)])
        #expect(signedIn.status == 303)
        let cookie = try #require(ConsoleBroker.sessionCookie(signedIn))
        #expect(try broker.get("/", cookie: cookie).bodyText.contains("demo (viewer, operator, compliance, admin)"))
        // Each role's right, from the one session: compliance's lookup, admin's and operator's keys page.
        for page in ["/lookup", "/api-keys", "/audit"] {
            #expect(try broker.get(page, cookie: cookie).status == 200, "\(page)")
        }
        // Used once, every row of it.
        #expect(try broker.post("/link", form: [("token", token)]).status == 403)
        #expect(try broker.count("SELECT count(*) FROM console_links WHERE operator = 'demo' AND used_at IS NULL") == 0)
        #expect(
            try broker.count(
                """
                SELECT count(*) FROM audit_log WHERE action = 'console.link_redeemed' AND subject = 'console:demo'
                  AND detail->>'role' = 'viewer,operator,compliance,admin'
                """) == 1)
        for bad in ["viewer,root", "viewer,", ",", "Admin"] {
            let refused = try ChildProcess.run(
                Self.executable, ["console", "link", "--operator", "x", "--role", bad], environment: environment)
            #expect(refused.status == 2, "\(bad): \(refused.output)")
        }
    }

    @Test("settings: unset listen is no console; every problem reported at once; the role map parsed")
    func settings() throws {
        #expect(try ConsoleConfiguration.load(environment: [:], apiListen: "127.0.0.1:8080") == nil)
        #expect(throws: ConsoleConfiguration.Invalid.self) {
            try ConsoleConfiguration.load(environment: ["CONSOLE_OIDC_ISSUER": "https://idp"], apiListen: "127.0.0.1:8080")
        }
        let invalid = #expect(throws: ConsoleConfiguration.Invalid.self) {
            try ConsoleConfiguration.load(
                environment: [
                    "BROKER_CONSOLE_LISTEN": "127.0.0.1:8080", "BROKER_CONSOLE_URL": "console.example/",
                    "CONSOLE_OIDC_ISSUER": "https://idp.example", "CONSOLE_OIDC_ROLE_MAP": "ops=root",
                ], apiListen: "127.0.0.1:8080")
        }
        let problems = invalid?.problems.joined(separator: "\n") ?? ""
        for name in [
            "BROKER_CONSOLE_LISTEN", "BROKER_CONSOLE_URL", "CONSOLE_OIDC_CLIENT_ID", "CONSOLE_OIDC_CLIENT_SECRET",
            "CONSOLE_OIDC_ROLE_MAP",
        ] {
            #expect(problems.contains(name), "\(name)")
        }
        let loaded = try #require(
            try ConsoleConfiguration.load(
                environment: [
                    "BROKER_CONSOLE_LISTEN": "127.0.0.1:8081", "CONSOLE_OIDC_ISSUER": "https://idp.example",
                    "CONSOLE_OIDC_CLIENT_ID": "c", "CONSOLE_OIDC_CLIENT_SECRET": "s",
                    "CONSOLE_OIDC_ROLE_MAP": "ops=operator, dpo=compliance, dpo=viewer", "CONSOLE_OIDC_GROUPS_CLAIM": "roles",
                ], apiListen: "127.0.0.1:8080"))
        #expect(loaded.publicURL == "http://127.0.0.1:8081")
        #expect(loaded.oidc?.roleMap == ["ops": [.operator], "dpo": [.compliance, .viewer]])
        #expect(loaded.oidc?.groupsClaim == "roles")
    }
}
