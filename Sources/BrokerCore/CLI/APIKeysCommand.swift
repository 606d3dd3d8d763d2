import CommandArguments
import Foundation
import Observability

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
            let secret = try BrokerCommand.withDatabase(environment) { database in
                try APIKeyStore(pool: database.pool).create(name: name, scopes: scopes).secret
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
                print("ID\tNAME\tSCOPES\tCREATED\tREVOKED")
                for key in keys {
                    let scopes = key.scopes.sorted().map(\.rawValue).joined(separator: ",")
                    let revoked = key.revokedAt.map(RFC3339.string(from:)) ?? "-"
                    print("\(key.id)\t\(key.name)\t\(scopes)\t\(RFC3339.string(from: key.createdAt))\t\(revoked)")
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
}
