import BrokerAPI
import BrokerCore
import Foundation
import TestSupport
import Testing

@Suite("Configuration")
struct ConfigurationTests {
    @Test("reports every problem at once, one message each, naming the variable")
    func everyProblem() throws {
        let error = #expect(throws: BrokerConfiguration.Invalid.self) {
            try BrokerConfiguration.load(
                environment: [
                    "BROKER_LISTEN": "8080", "BROKER_HTTP_THREADS": "lots", "BROKER_LOG_LEVEL": "loud",
                    "APPLE_TEAM_ID": "short", "APPLE_PRIVATE_KEY_PATH": "/nonexistent.p8",
                    "TOKEN_ENCRYPTION_KEY": "dG9vIHNob3J0",
                ],
                requireApple: true)
        }
        let problems = try #require(error?.problems)
        for variable in [
            "BROKER_LISTEN", "BROKER_HTTP_THREADS", "BROKER_LOG_LEVEL", "APPLE_TEAM_ID", "APPLE_KEY_ID",
            "APPLE_PRIVATE_KEY_PATH", "APPLE_CLIENT_IDS", "TOKEN_ENCRYPTION_KEY",
        ] {
            #expect(problems.filter { $0.hasPrefix(variable + ":") }.count == 1, "one message for \(variable)")
        }
        #expect(problems.count == 8)
    }

    @Test("a complete environment loads with its defaults")
    func loads() throws {
        let key = try TestKeys.privateKeyFile()
        let configuration = try BrokerConfiguration.load(
            environment: [
                "APPLE_TEAM_ID": "TEAMID1234", "APPLE_KEY_ID": "KEYID12345", "APPLE_PRIVATE_KEY_PATH": key,
                "APPLE_CLIENT_IDS": "com.example.app, com.example.web", "APPLE_APP_GROUPS": "com.example.app=com.example.web",
                "TOKEN_ENCRYPTION_KEY": "k2:" + String(repeating: "A", count: 43) + "=,k1:" + String(repeating: "B", count: 43)
                    + "=",
            ],
            requireApple: true)
        #expect(configuration.databaseURL == nil)
        #expect(configuration.listen == "127.0.0.1:8080")
        #expect(configuration.apple?.clientIDs == ["com.example.app", "com.example.web"])
        #expect(configuration.apple?.baseURL == "https://appleid.apple.com")
        #expect(configuration.tokenKeys?.currentKeyID == "k2")
        #expect(configuration.roles.count == BrokerConfiguration.Role.allCases.count)
    }

    @Test("the webhook lease must outlast the DNS and delivery timeouts; webhook limits have defaults")
    func webhookLease() throws {
        let defaults = try BrokerConfiguration.load(environment: [:], requireApple: false).dispatch
        #expect(defaults.lease == .seconds(60) && defaults.maximumSubscriptions == 50)
        #expect(defaults.deadLetterRetention == .seconds(30 * 86_400) && defaults.dnsTimeout == .milliseconds(2000))
        let error = #expect(throws: BrokerConfiguration.Invalid.self) {
            try BrokerConfiguration.load(environment: ["BROKER_WEBHOOK_TIMEOUT_MS": "120000"], requireApple: false)
        }
        #expect(error?.problems.count == 1)
        #expect(error?.problems.first?.hasPrefix("BROKER_WEBHOOK_LEASE_SECONDS:") == true)
        let longer = try BrokerConfiguration.load(
            environment: ["BROKER_WEBHOOK_TIMEOUT_MS": "120000", "BROKER_WEBHOOK_LEASE_SECONDS": "180"], requireApple: false)
        #expect(longer.dispatch.lease == .seconds(180))
    }

    @Test(
        "APPLE_APP_GROUPS: required with several client ids (the broker refuses to guess); primary=member lists; loners; problems named"
    )
    func appGroups() throws {
        let key = try TestKeys.privateKeyFile()
        let base = [
            "APPLE_TEAM_ID": "TEAMID1234", "APPLE_KEY_ID": "KEYID12345", "APPLE_PRIVATE_KEY_PATH": key,
            "APPLE_CLIENT_IDS": "com.example.app,com.example.web,com.example.mac,com.other.app",
            "TOKEN_ENCRYPTION_KEY": String(repeating: "A", count: 43) + "=",
        ]
        // Unset with four client ids: no guess (lumping them made one app's consent-revoked end
        // the others', protocol reference §12.6); the message names the variable and an example.
        let unset = #expect(throws: BrokerConfiguration.Invalid.self) {
            try BrokerConfiguration.load(environment: base, requireApple: true)
        }
        #expect(unset?.problems.count == 1)
        let message = unset?.problems.first ?? ""
        #expect(message.hasPrefix("APPLE_APP_GROUPS: missing"), "\(message)")
        #expect(message.contains("APPLE_APP_GROUPS='com.example.app=com.example.web;com.example.mac'"), "\(message)")
        // One client id needs no grouping: it is its own group.
        let lone = try #require(
            try BrokerConfiguration.load(
                environment: base.merging(["APPLE_CLIENT_IDS": "com.example.app"]) { $1 }, requireApple: true
            )
            .apple?.appGroups)
        #expect(lone.groups.map(\.clientIDs) == [["com.example.app"]])

        let grouped = try #require(
            try BrokerConfiguration.load(
                environment: base.merging(["APPLE_APP_GROUPS": "com.example.app=com.example.web, com.example.mac; com.other.app"])
                { $1 },
                requireApple: true
            ).apple?.appGroups)
        #expect(grouped.group(of: "com.example.web").primary == "com.example.app")
        #expect(grouped.group(of: "com.example.mac").clientIDs == ["com.example.app", "com.example.web", "com.example.mac"])
        #expect(grouped.group(of: "com.other.app").clientIDs == ["com.other.app"])
        #expect(grouped.group(of: "com.unknown").clientIDs == ["com.unknown"], "an unknown id is a group of its own")
        // A client id in no group is a group of its own.
        let partial = try #require(
            try BrokerConfiguration.load(
                environment: base.merging(["APPLE_APP_GROUPS": "com.example.app=com.example.web"]) { $1 }, requireApple: true
            ).apple?.appGroups)
        #expect(partial.group(of: "com.example.mac").primary == "com.example.mac")
        // A primary outside APPLE_CLIENT_IDS may name a group (a web-only deployment).
        let webOnly = try #require(
            try BrokerConfiguration.load(
                environment: base.merging(["APPLE_APP_GROUPS": "com.example.ios=com.example.web"]) { $1 }, requireApple: true
            ).apple?.appGroups)
        #expect(webOnly.allClientIDs.contains("com.example.ios"))

        for (value, message) in [
            ("com.example.app=com.nowhere", "com.nowhere is not one of APPLE_CLIENT_IDS"),
            ("com.example.app=com.example.web;com.example.mac=com.example.web", "com.example.web is in more than one group"),
            ("=com.example.web", "expected primary=member,member"),
            ("com.lonely", "com.lonely is not one of APPLE_CLIENT_IDS"),
        ] {
            let error = #expect(throws: BrokerConfiguration.Invalid.self) {
                try BrokerConfiguration.load(environment: base.merging(["APPLE_APP_GROUPS": value]) { $1 }, requireApple: true)
            }
            #expect(
                error?.problems.contains { $0.hasPrefix("APPLE_APP_GROUPS:") && $0.contains(message) } == true,
                "\(value): \(error?.problems ?? [])")
        }
    }

    @Test("web sign-in needs both settings, registered client ids and acceptable URLs")
    func webSignIn() throws {
        let key = try TestKeys.privateKeyFile()
        let base = [
            "APPLE_TEAM_ID": "TEAMID1234", "APPLE_KEY_ID": "KEYID12345", "APPLE_PRIVATE_KEY_PATH": key,
            "APPLE_CLIENT_IDS": "com.example.app,com.example.web", "APPLE_APP_GROUPS": "com.example.app=com.example.web",
            "TOKEN_ENCRYPTION_KEY": String(repeating: "A", count: 43) + "=",
        ]
        let configured = try BrokerConfiguration.load(
            environment: base.merging([
                "BROKER_PUBLIC_URL": "https://auth.example.com/",
                "APPLE_WEB_RETURN_URLS":
                    "com.example.web=https://a.example.com/done, https://b.example.com/x?y=1 ; com.example.app=http://127.0.0.1:3000/",
            ]) { $1 },
            requireApple: true)
        #expect(configured.web?.callbackURL == "https://auth.example.com/v1/apple/web/callback")
        #expect(configured.web?.returnURLs["com.example.web"] == ["https://a.example.com/done", "https://b.example.com/x?y=1"])
        #expect(configured.web?.returnURLs["com.example.app"] == ["http://127.0.0.1:3000/"])
        #expect(try BrokerConfiguration.load(environment: base, requireApple: true).web == nil)

        func problems(_ extra: [String: String]) -> [String] {
            let error = #expect(throws: BrokerConfiguration.Invalid.self) {
                try BrokerConfiguration.load(environment: base.merging(extra) { $1 }, requireApple: true)
            }
            return error?.problems ?? []
        }
        #expect(problems(["BROKER_PUBLIC_URL": "https://auth.example.com"]).first?.contains("needs both") == true)
        #expect(
            problems([
                "BROKER_PUBLIC_URL": "http://auth.example.com", "APPLE_WEB_RETURN_URLS": "com.example.web=https://a.example.com/",
            ])
            .first?.hasPrefix("BROKER_PUBLIC_URL:") == true)
        #expect(
            problems([
                "BROKER_PUBLIC_URL": "https://auth.example.com", "APPLE_WEB_RETURN_URLS": "com.unknown=https://a.example.com/",
            ])
            .first?.contains("not one of APPLE_CLIENT_IDS") == true)
        #expect(
            problems([
                "BROKER_PUBLIC_URL": "https://auth.example.com",
                "APPLE_WEB_RETURN_URLS": "com.example.web=https://a.example.com/#frag",
            ])
            .first?.hasPrefix("APPLE_WEB_RETURN_URLS:") == true)
    }

    @Test("commands that do not talk to Apple need no Apple settings")
    func withoutApple() throws {
        let configuration = try BrokerConfiguration.load(environment: [:], requireApple: false)
        #expect(configuration.apple == nil)
    }

    @Test("NAME_FILE supplies NAME from a mounted secret; an unreadable file is a problem")
    func fromFiles() throws {
        let secret = TestFiles.path("secret")
        try ("k7:" + String(repeating: "C", count: 43) + "=\n").write(toFile: secret, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: secret) }
        let configuration = try BrokerConfiguration.load(
            environment: ["TOKEN_ENCRYPTION_KEY_FILE": secret], requireApple: false)
        #expect(configuration.tokenKeys?.currentKeyID == "k7")
        // An explicit value wins over the file.
        let explicit = try BrokerConfiguration.load(
            environment: [
                "TOKEN_ENCRYPTION_KEY_FILE": secret, "TOKEN_ENCRYPTION_KEY": "k1:" + String(repeating: "B", count: 43) + "=",
            ],
            requireApple: false)
        #expect(explicit.tokenKeys?.currentKeyID == "k1")
        let error = #expect(throws: BrokerConfiguration.Invalid.self) {
            try BrokerConfiguration.load(environment: ["TOKEN_ENCRYPTION_KEY_FILE": "/nonexistent/key"], requireApple: false)
        }
        #expect(error?.problems == ["TOKEN_ENCRYPTION_KEY_FILE: cannot read /nonexistent/key"])
        // Only the broker's secrets: another program's *_FILE variable is none of its business.
        #expect(throws: Never.self) {
            try BrokerConfiguration.load(environment: ["TF_CLI_CONFIG_FILE": "/nonexistent/.terraformrc"], requireApple: false)
        }
    }

    @Test("DATABASE_LISTEN_URL: the listener's direct connection, only beside DATABASE_URL")
    func listenURL() throws {
        let both = try BrokerConfiguration.load(
            environment: [
                "DATABASE_URL": "postgres://broker@pgbouncer/broker", "DATABASE_LISTEN_URL": "postgres://broker@db/broker",
            ],
            requireApple: false)
        #expect(both.databaseListenURL == "postgres://broker@db/broker")
        let error = #expect(throws: BrokerConfiguration.Invalid.self) {
            try BrokerConfiguration.load(environment: ["DATABASE_LISTEN_URL": "postgres://broker@db/broker"], requireApple: false)
        }
        #expect(error?.problems.first?.hasPrefix("DATABASE_LISTEN_URL:") == true)
    }
}
