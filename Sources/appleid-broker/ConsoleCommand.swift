import BrokerCore
import CommandArguments
import Console
import Foundation

/// `appleid-broker console link`: the console's break-glass sign-in, for when no identity
/// provider is configured or it is down; `console end-sessions`: an operator signed out everywhere.
enum ConsoleCommand {
    static func link(_ arguments: ParsedArguments, environment: [String: String]) throws -> Int32 {
        let name = try arguments.required("operator")
        guard !name.isEmpty, name.utf8.count <= 100, !name.contains(where: \.isNewline) else {
            throw arguments.usageError("--operator takes a name of 1 to 100 bytes")
        }
        // One role or several, comma-separated (`make run`'s demo operator has every role).
        let names = try arguments.required("role").split(separator: ",", omittingEmptySubsequences: false)
        let roles = Set(names.compactMap { ConsoleRole(rawValue: $0.trimmingCharacters(in: .whitespaces)) })
        guard !names.isEmpty, roles.count == Set(names.map { $0.trimmingCharacters(in: .whitespaces) }).count else {
            throw arguments.usageError(
                "--role takes one or more of " + ConsoleRole.allCases.map(\.rawValue).joined(separator: ", ")
                    + ", comma-separated")
        }
        guard let ttl = seconds(arguments.options["ttl"] ?? "15m"), (60...86_400).contains(ttl) else {
            throw arguments.usageError("--ttl takes a duration from 1m to 24h, e.g. 900s, 15m or 1h")
        }
        let api = try BrokerConfiguration.load(environment: environment, requireApple: false)
        guard let console = try ConsoleConfiguration.load(environment: environment, apiListen: api.listen) else {
            BrokerCommand.printError("the console is off: set BROKER_CONSOLE_LISTEN (and BROKER_CONSOLE_URL)")
            return 2
        }
        let token = try BrokerCommand.withDatabase(environment) { database in
            try ConsoleSessionStore(pool: database.pool).createLink(
                operatorID: name, roles: roles, ttlSeconds: ttl, actor: "cli")
        }
        print("\(console.publicURL)/link?token=\(token)")
        return 0
    }

    /// `appleid-broker console end-sessions --operator NAME`: ends every live console session of
    /// the operator (their IdP `sub`, or a sign-in link's name) at once; prints how many.
    static func endSessions(_ arguments: ParsedArguments, environment: [String: String]) throws -> Int32 {
        let name = try arguments.required("operator")
        guard !name.isEmpty, name.utf8.count <= 255, !name.contains(where: \.isNewline) else {
            throw arguments.usageError("--operator takes a name or sub of 1 to 255 bytes")
        }
        let ended = try BrokerCommand.withDatabase(environment) { database in
            try ConsoleSessionStore(pool: database.pool).endSessions(operatorID: name, actor: "cli")
        }
        print("\(ended) session(s) of \(name) ended")
        return 0
    }

    /// `900s`, `15m`, `1h`, or plain seconds.
    static func seconds(_ text: String) -> Int? {
        let units: [Character: Int] = ["s": 1, "m": 60, "h": 3600]
        if let unit = text.last, let factor = units[unit] { return Int(text.dropLast()).map { $0 * factor } }
        return Int(text)
    }
}
