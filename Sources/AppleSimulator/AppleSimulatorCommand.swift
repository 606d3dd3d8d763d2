import BrokerCrypto
import CommandArguments
import Foundation
import Glibc
import HTTPClient
import Observability

/// The `apple-sim` command line: serve the simulator, or drive a running one.
public enum AppleSimulatorCommand {
    /// Every command and the options it takes; anything else is refused.
    static let commands = CommandTable(
        program: "apple-sim",
        commands: [
            CommandSpec(
                ["serve"],
                "[--listen 127.0.0.1:8090] [--team TEAMID --key-id KEYID --key FILE.p8 --client-ids a,b] "
                    + "[--return-urls id=url,url;id2=url] [--app-groups primary,member;primary2]",
                summary: "play appleid.apple.com on loopback until SIGTERM/SIGINT; --return-urls registers the\n"
                    + "web Return URLs per Services ID, --app-groups groups client ids under primary App IDs",
                options: ["listen", "team", "key-id", "key", "client-ids", "return-urls", "app-groups"]),
            CommandSpec(
                ["mint-token"],
                "--client-id ID [--sub SUB] [--raw-nonce N] [--email E] [--real-user-status 0|1|2] "
                    + "[--relay-domain D] [--transfer-sub T] [--managed-account] [--booleans-as-strings] [--with-code] "
                    + "[--format json|env] [--url URL]",
                summary: "print a fresh identity token (and code) as JSON, or as shell\n"
                    + "assignments ID_TOKEN=… SUB=… EMAIL=… CODE=… for `eval` (--format env);\n"
                    + "--managed-account: a Managed Apple Account (org_id, a real address)",
                options: [
                    "client-id", "sub", "raw-nonce", "email", "real-user-status", "relay-domain", "transfer-sub", "format", "url",
                ],
                flags: ["booleans-as-strings", "with-code", "managed-account"]),
            CommandSpec(
                ["notify"], "--to URL --type TYPE --sub SUB --client-id ID [--url URL]",
                summary: "sign and POST a server-to-server notification (types: email-disabled,\n"
                    + "email-enabled, consent-revoked, account-delete)",
                options: ["to", "type", "sub", "client-id", "url"]),
            CommandSpec(
                ["rotate-keys"], "[--retire] [--url URL]",
                summary: "add a signing key (and stop publishing the old ones with --retire)", options: ["url"],
                flags: ["retire"]),
            CommandSpec(
                ["faults"], faultOptions.map(\.usage).joined(separator: " ") + " [--url URL]",
                summary: "set every switch of Apple's behaviour at once (what is not given goes back to\n"
                    + "Apple's default); docs/development.md lists what each one does",
                options: Set(faultOptions.filter { $0.kind != .flag && $0.kind != .offFlag }.map(\.option) + ["url"]),
                flags: Set(faultOptions.filter { $0.kind == .flag || $0.kind == .offFlag }.map(\.option))),
            CommandSpec(
                ["revoke-consent"], "--sub SUB [--client-id ID] [--team TEAMID] [--url URL]",
                summary: "the user stops using Sign in with Apple for the app group (every app without\n"
                    + "--client-id): their tokens die, their next web authorization carries `user` again,\n"
                    + "and with `faults --notification-url` Apple sends its consent-revoked there",
                options: ["sub", "client-id", "team", "url"]),
            CommandSpec(
                ["change-password"], "--sub SUB [--team TEAMID] [--url URL]",
                summary: "the user changes their password: refresh tokens answer invalid_grant, the\n"
                    + "authorization stays", options: ["sub", "team", "url"]),
            CommandSpec(
                ["transfer-app"], "--client-ids A,B --from TEAMID --to TEAMID [--url URL]",
                summary: "an app transfer completes: the client ids (a primary App ID and its grouped IDs)\n"
                    + "move to the other team; the old team can neither refresh nor revoke their tokens",
                options: ["client-ids", "from", "to", "url"]),
            CommandSpec(["revocations"], "[--url URL]", summary: "print every /auth/revoke call so far", options: ["url"]),
        ],
        footer: """
            --url is the running simulator's address: http://127.0.0.1:8090 unless APPLE_SIM_URL says otherwise.
            """)

    public static func main() -> Never {
        var blocked = sigset_t()
        sigemptyset(&blocked)
        sigaddset(&blocked, SIGTERM)
        sigaddset(&blocked, SIGINT)
        pthread_sigmask(SIG_BLOCK, &blocked, nil)
        exit(run(Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment))
    }

    static func run(_ arguments: [String], environment: [String: String] = [:]) -> Int32 {
        let parsed: ParsedArguments
        do {
            switch try commands.parse(arguments) {
            case .help, .version, .group:
                print(commands.usage)
                return 0
            case .run(let arguments):
                parsed = arguments
            }
        } catch {
            printError("\(error)")
            return 2
        }
        let options = parsed.options
        let flags = parsed.flags
        let command = parsed.command.words[0]
        let url = options["url"] ?? environment["APPLE_SIM_URL"].flatMap { $0.isEmpty ? nil : $0 } ?? "http://127.0.0.1:8090"
        do {
            switch command {
            case "serve":
                return try serve(options)
            case "mint-token":
                guard let clientID = options["client-id"] else { throw Usage("--client-id is required") }
                var body: [String: Any] = ["client_id": clientID]
                body["sub"] = options["sub"]
                body["raw_nonce"] = options["raw-nonce"]
                body["email"] = options["email"]
                body["real_user_status"] = options["real-user-status"].flatMap(Int.init)
                if flags.contains("booleans-as-strings") { body["booleans_as_strings"] = true }
                if flags.contains("with-code") { body["with_code"] = true }
                if flags.contains("managed-account") { body["managed_account"] = true }
                body["relay_domain"] = options["relay-domain"]
                body["transfer_sub"] = options["transfer-sub"]
                switch options["format"] ?? "json" {
                case "json": return try call(url + "/sim/tokens", method: "POST", body: body)
                case "env": return try call(url + "/sim/tokens", method: "POST", body: body, printing: shellAssignments)
                default: throw Usage("--format is json or env")
                }
            case "notify":
                guard let to = options["to"], let type = options["type"], let sub = options["sub"],
                    let clientID = options["client-id"]
                else { throw Usage("--to, --type, --sub and --client-id are required") }
                return try call(
                    url + "/sim/notifications", method: "POST",
                    body: ["url": to, "type": type, "sub": sub, "client_id": clientID])
            case "rotate-keys":
                let status = try call(url + "/sim/keys/rotate", method: "POST", body: [:])
                return flags.contains("retire") ? try call(url + "/sim/keys/retire", method: "POST", body: [:]) : status
            case "faults":
                return try call(url + "/sim/faults", method: "PUT", body: try faultsBody(options, flags: flags))
            case "revoke-consent", "change-password":
                guard let sub = options["sub"] else { throw Usage("--sub is required") }
                var body: [String: Any] = ["sub": sub]
                body["client_id"] = options["client-id"]
                body["team_id"] = options["team"]
                let path = command == "revoke-consent" ? "/sim/consent/revoke" : "/sim/users/password-change"
                return try call(url + path, method: "POST", body: body)
            case "transfer-app":
                guard let clientIDs = options["client-ids"], let from = options["from"], let to = options["to"] else {
                    throw Usage("--client-ids, --from and --to are required")
                }
                return try call(
                    url + "/sim/teams/transfer-app", method: "POST",
                    body: ["client_ids": clientIDs.split(separator: ",").map(String.init), "from_team": from, "to_team": to])
            case "revocations":
                return try call(url + "/sim/revocations", method: "GET", body: nil)
            default:
                preconditionFailure("\(command) is in the table but has no handler")
            }
        } catch let usageError as Usage {
            printError("\(parsed.usageError(usageError.text))")
            return 2
        } catch {
            printError("error: \(error)")
            return 1
        }
    }

    /// One `apple-sim faults` option per `FaultSettings` member (a test checks that none is
    /// missing): the option, the JSON key of `PUT /sim/faults`, and how its value is read.
    struct FaultOption: Sendable {
        enum Kind: Sendable { case int, double, string, list, intList, flag, offFlag }
        let option: String
        let key: FaultSettings.CodingKeys
        let kind: Kind
        var placeholder = ""

        var usage: String {
            switch kind {
            case .flag, .offFlag: "[--\(option)]"
            default: "[--\(option) \(placeholder)]"
            }
        }
    }

    static let faultOptions: [FaultOption] = [
        .init(option: "latency-ms", key: .latencyMilliseconds, kind: .int, placeholder: "N"),
        .init(option: "error-rate", key: .errorRate, kind: .double, placeholder: "0.3"),
        .init(option: "error-statuses", key: .errorStatuses, kind: .intList, placeholder: "500,503,429"),
        .init(option: "retry-after", key: .retryAfterSeconds, kind: .int, placeholder: "SECONDS"),
        .init(option: "retry-after-http-date", key: .retryAfterAsDate, kind: .flag),
        .init(option: "timeout-rate", key: .timeoutRate, kind: .double, placeholder: "R"),
        .init(option: "timeout-ms", key: .timeoutMilliseconds, kind: .int, placeholder: "N"),
        .init(option: "timeout-before-work", key: .timeoutAfterWork, kind: .offFlag),
        .init(option: "invalid-grant", key: .forceInvalidGrant, kind: .flag),
        .init(
            option: "revoked-grant-error", key: .revokedGrantError, kind: .string, placeholder: "invalid_grant|invalid_request"),
        .init(option: "invalid-client", key: .forceInvalidClient, kind: .flag),
        .init(option: "empty-key-set", key: .emptyKeySet, kind: .flag),
        .init(option: "endpoints", key: .endpoints, kind: .list, placeholder: "token,revoke,keys,migration,authorize"),
        .init(option: "malformed-request", key: .malformedRequest, kind: .flag),
        .init(option: "malformed-request-subs", key: .malformedRequestSubs, kind: .list, placeholder: "SUB,SUB"),
        .init(option: "transfer-age-days", key: .transferAgeDays, kind: .int, placeholder: "DAYS"),
        .init(option: "no-user-field-after-revocation", key: .userFieldAfterRevocation, kind: .offFlag),
        .init(
            option: "relay-domain", key: .relayDomain, kind: .string, placeholder: "privaterelay.appleid.com|private.icloud.com"),
        // Apple's clock (issue 35): notification delivery, intermittent request defects.
        .init(option: "notification-url", key: .notificationURL, kind: .string, placeholder: "URL"),
        .init(option: "notification-delay-ms", key: .notificationDelayMilliseconds, kind: .int, placeholder: "N"),
        .init(option: "notification-timeout-ms", key: .notificationTimeoutMilliseconds, kind: .int, placeholder: "N"),
        .init(option: "notification-retries", key: .notificationRetries, kind: .int, placeholder: "N"),
        .init(option: "notification-retry-ms", key: .notificationRetryMilliseconds, kind: .int, placeholder: "N"),
        .init(option: "notification-duplicates", key: .notificationDuplicates, kind: .int, placeholder: "N"),
        .init(option: "request-error-rate", key: .requestErrorRate, kind: .double, placeholder: "R"),
        .init(option: "request-error-seed", key: .requestErrorSeed, kind: .int, placeholder: "N"),
    ]

    /// The `PUT /sim/faults` body of an `apple-sim faults` command line.
    static func faultsBody(_ options: [String: String], flags: Set<String>) throws -> [String: Any] {
        var body: [String: Any] = [:]
        for fault in faultOptions {
            let key = fault.key.stringValue
            switch fault.kind {
            case .flag:
                if flags.contains(fault.option) { body[key] = true }
            case .offFlag:
                if flags.contains(fault.option) { body[key] = false }
            default:
                guard let text = options[fault.option] else { continue }
                let value: Any? =
                    switch fault.kind {
                    case .int: Int(text)
                    case .double: Double(text)
                    case .string: text
                    case .list: text.split(separator: ",").map(String.init)
                    case .intList:
                        Optional(text.split(separator: ",").compactMap { Int($0) }).flatMap {
                            $0.count == text.split(separator: ",").count ? $0 : nil
                        }
                    case .flag, .offFlag: nil
                    }
                guard let value else { throw Usage("--\(fault.option) takes \(fault.placeholder)") }
                body[key] = value
            }
        }
        return body
    }

    struct Usage: Error {
        let text: String
        init(_ text: String) { self.text = text }
    }

    private static func serve(_ options: [String: String]) throws -> Int32 {
        let logger = Logger(label: "apple-sim", sink: LogSink(level: .notice))
        let simulator = try AppleSimulator(logger: logger)
        if let team = options["team"] {
            guard let keyID = options["key-id"], let keyFile = options["key"], let clients = options["client-ids"] else {
                throw Usage("--team needs --key-id, --key and --client-ids")
            }
            let publicKey = try AppleSimulator.publicKey(fromPEM: try String(contentsOfFile: keyFile, encoding: .utf8))
            simulator.registerTeam(
                teamID: team, keyID: keyID, publicKey: publicKey,
                clientIDs: clients.split(separator: ",").map(String.init))
        }
        for entry in (options["return-urls"] ?? "").split(separator: ";") {
            let parts = entry.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            guard parts.count == 2 else { throw Usage("--return-urls takes id=url,url;id2=url") }
            simulator.registerReturnURLs(clientID: parts[0], urls: parts[1].split(separator: ",").map(String.init))
        }
        if let groups = options["app-groups"] {
            simulator.setAppGroups(groups.split(separator: ";").map { $0.split(separator: ",").map(String.init) })
        }
        let port = try simulator.start(listen: options["listen"] ?? "127.0.0.1:8090")
        logger.notice("apple-sim listening", [("port", String(port))])
        var signals = sigset_t()
        sigemptyset(&signals)
        sigaddset(&signals, SIGTERM)
        sigaddset(&signals, SIGINT)
        var received: Int32 = 0
        sigwait(&signals, &received)
        simulator.stop()
        return 0
    }

    private static func call(
        _ url: String, method: String, body: [String: Any]?, printing format: (String) throws -> String = { $0 }
    ) throws -> Int32 {
        let data = try body.map { try JSONSerialization.data(withJSONObject: $0) } ?? Data()
        let response = try CurlTransport().send(
            .init(method: method, url: url, headers: [("Content-Type", "application/json")], body: Array(data)))
        guard (200..<300).contains(response.status) else {
            print(response.bodyText)
            return 1
        }
        print(try format(response.bodyText))
        return 0
    }

    /// `{"id_token":…,"sub":…}` as `ID_TOKEN='…'` lines, upper-cased names, for `eval`.
    static func shellAssignments(_ json: String) throws -> String {
        guard let object = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any] else {
            throw Usage("the simulator answered something other than a JSON object")
        }
        return object.keys.sorted().compactMap { key in
            let value: String
            switch object[key] {
            case let text as String: value = text
            case let number as NSNumber: value = number.stringValue
            default: return nil
            }
            // Single quotes need no escaping inside but themselves: ' becomes '\''.
            return key.uppercased() + "='" + value.replacingOccurrences(of: "'", with: "'\\''") + "'"
        }.joined(separator: "\n")
    }

    private static func printError(_ text: String) {
        FileHandle.standardError.write(Data((text + "\n").utf8))
    }
}
