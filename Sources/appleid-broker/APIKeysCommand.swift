import BrokerAPI
import BrokerCore
import CommandArguments
import Foundation
import Observability
import Workers

/// `appleid-broker api-keys create|list|revoke`.
enum APIKeysCommand {
    static func run(_ arguments: ParsedArguments, environment: [String: String]) throws -> Int32 {
        switch arguments.command.words[1] {
        case "create":
            let name = try arguments.required("name")
            let scopeText = try arguments.required("scopes")
            guard let scopes = Scope.parseList(scopeText) else {
                throw arguments.usageError(
                    "--scopes takes a comma list of " + Scope.allCases.map(\.rawValue).joined(separator: ", "))
            }
            let clientIDs = try arguments.options["client-ids"].map { try limitedClientIDs($0, arguments, environment) }
            let secret = try BrokerCommand.withDatabase(environment) { database in
                try APIKeyStore(pool: database.pool).create(name: name, scopes: scopes, clientIDs: clientIDs).secret
            }
            print(secret)
            return 0
        case "list":
            let keys = try BrokerCommand.withDatabase(environment) { try APIKeyStore(pool: $0.pool).list() }
            if arguments.flags.contains("json") {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
                encoder.dateEncodingStrategy = .iso8601
                print(String(decoding: try encoder.encode(keys), as: UTF8.self))
            } else {
                print("ID\tNAME\tSCOPES\tCLIENT_IDS\tCREATED\tREVOKED")
                for key in keys {
                    let scopes = key.scopes.sorted().map(\.rawValue).joined(separator: ",")
                    let revoked = key.revokedAt.map(RFC3339.string(from:)) ?? "-"
                    let clients = key.clientIDs?.joined(separator: ",") ?? "*"
                    print("\(key.id)\t\(key.name)\t\(scopes)\t\(clients)\t\(RFC3339.string(from: key.createdAt))\t\(revoked)")
                }
            }
            return 0
        case "revoke":
            let id = arguments.operands[0]
            let revoked = try BrokerCommand.withDatabase(environment) { try APIKeyStore(pool: $0.pool).revoke(id: id) }
            if revoked {
                BrokerCommand.printError("revoked \(id)")
                return 0
            }
            BrokerCommand.printError("no active API key with id \(id)")
            return 1
        default:
            preconditionFailure("api-keys \(arguments.command.words[1]) has no handler")
        }
    }

    /// `--client-ids A,B`: each must be a client id the broker accepts (APPLE_CLIENT_IDS or
    /// an APPLE_APP_GROUPS member), so a typo cannot make a key that reaches nothing.
    private static func limitedClientIDs(
        _ text: String, _ arguments: ParsedArguments, _ environment: [String: String]
    ) throws -> [String] {
        let ids = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        guard !ids.isEmpty else { throw arguments.usageError("--client-ids takes a comma list of client ids") }
        let configuration = try BrokerConfiguration.load(environment: environment, requireApple: false)
        guard let apple = configuration.apple else {
            throw arguments.usageError("--client-ids needs the Apple settings (APPLE_CLIENT_IDS) to check the client ids against")
        }
        let known = Set(apple.clientIDs).union(apple.appGroups.allClientIDs)
        for id in ids where !known.contains(id) {
            throw arguments.usageError(
                "--client-ids: \(id) is not one of APPLE_CLIENT_IDS (\(known.sorted().joined(separator: ", ")))")
        }
        return Array(Set(ids)).sorted()
    }
}
