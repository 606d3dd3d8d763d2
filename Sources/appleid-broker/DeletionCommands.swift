import BrokerAPI
import BrokerCore
import CommandArguments
import Foundation
import Observability
import PostgresClient
import StrictJSON
import Workers

/// `appleid-broker delete-user …` and `appleid-broker deletions list|retry`.
enum DeletionCommands {
    static func deleteUser(_ arguments: ParsedArguments, environment: [String: String]) throws -> Int32 {
        let reason = try arguments.required("reason")
        let requestedBy = arguments.options["requested-by"] ?? environment["USER"] ?? "cli"
        let target: DeletionStore.Target
        switch (arguments.options["user-id"], arguments.options["apple-sub"]) {
        case (let id?, nil):
            guard let uuid = UUID(canonicalText: id) else { throw arguments.usageError("--user-id must be a UUID") }
            target = .user(uuid)
        case (nil, let sub?):
            target = .appleSub(sub)
        default:
            throw arguments.usageError("give exactly one of --user-id and --apple-sub")
        }
        guard let teamID = environment["APPLE_TEAM_ID"] ?? (target.isUser ? "" : nil) else {
            throw arguments.usageError("--apple-sub needs APPLE_TEAM_ID (subs are team-scoped)")
        }
        let code = arguments.options["authorization-code"]
        if code == nil && (arguments.options["client-id"] != nil || arguments.options["redirect-uri"] != nil) {
            throw arguments.usageError("--client-id and --redirect-uri go with --authorization-code")
        }
        let configuration = try BrokerConfiguration.load(environment: environment, requireApple: code != nil)
        return try BrokerCommand.withDatabase(environment) { database in
            let store = DeletionStore(
                pool: database.pool, teamID: teamID, hasher: configuration.tokenKeys.map(SubjectHasher.init(keys:)))
            var service = DeletionService(store: store, wake: {})
            if let tokenKeys = configuration.tokenKeys, let apple = configuration.apple {
                service.codes = .init(
                    tokenKeys: tokenKeys, clientIDs: Set(apple.clientIDs), redirectURIs: apple.redirectURIs,
                    webCallbackURL: configuration.web?.callbackURL)
            }
            do {
                let result = try service.request(
                    .init(
                        target: target, reason: reason, requestedBy: requestedBy, authorizationCode: code,
                        clientID: arguments.options["client-id"], redirectURI: arguments.options["redirect-uri"]),
                    source: .cli, actor: "cli:\(requestedBy)")
                print(result.id.lowercasedString)
                BrokerCommand.printError(result.created ? "deletion requested" : "a deletion is already open for this user")
                return 0
            } catch let error as BrokerError {
                var text = "\(error.code.rawValue): \(error.detail)"
                if let deletion = error.extensions["deletion_id"] { text += " (deletion \(deletion))" }
                BrokerCommand.printError(text)
                return 1
            }
        }
    }

    static func run(_ arguments: ParsedArguments, environment: [String: String]) throws -> Int32 {
        try BrokerCommand.withDatabase(environment) { database in
            let store = DeletionStore(pool: database.pool, teamID: environment["APPLE_TEAM_ID"] ?? "")
            switch arguments.command.words[1] {
            case "list":
                let state = try arguments.options["state"].map { text in
                    guard let state = DeletionState(rawValue: text) else {
                        throw arguments.usageError(
                            "--state must be one of \(DeletionState.allCases.map(\.rawValue).sorted().joined(separator: ", "))")
                    }
                    return state
                }
                guard let limit = Int(arguments.options["limit"] ?? "100"), (1...10_000).contains(limit) else {
                    throw arguments.usageError("--limit must be a number from 1 to 10000")
                }
                let records = try store.list(state: state, limit: limit)
                if arguments.flags.contains("json") {
                    print(String(decoding: JSONValue.array(records.map(\.json)).serialized(), as: UTF8.self))
                } else {
                    print("DELETION_ID\tUSER_ID\tSOURCE\tSTATE\tATTEMPTS\tCREATED\tLAST_ERROR")
                    for record in records {
                        print(
                            "\(record.id.lowercasedString)\t\(record.userID.lowercasedString)\t\(record.source.rawValue)\t\(record.state.rawValue)\t\(record.attempts)\t\(RFC3339.string(from: record.createdAt))\t\(record.lastError ?? "-")"
                        )
                    }
                }
                return 0
            case "retry":
                guard let id = UUID(canonicalText: arguments.operands[0]) else {
                    throw arguments.usageError("deletions retry needs a deletion id")
                }
                guard try store.retry(id, by: "cli") else {
                    BrokerCommand.printError("no failed deletion with id \(arguments.operands[0])")
                    return 1
                }
                BrokerCommand.printError("deletion \(id.lowercasedString) queued again")
                return 0
            default:
                preconditionFailure("deletions \(arguments.command.words[1]) has no handler")
            }
        }
    }
}

extension DeletionStore.Target {
    var isUser: Bool {
        if case .user = self { return true }
        return false
    }
}
