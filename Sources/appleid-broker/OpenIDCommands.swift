import BrokerCore
import CommandArguments
import Foundation
import Observability
import OpenIDProvider
import StrictJSON

/// `appleid-broker oidc-keys rotate|list` and `oidc-clients create|list|delete`: the OpenID
/// Provider's signing keys and relying parties (docs/command-line.md).
enum OpenIDCommands {
    static let specs = [
        CommandSpec(
            ["oidc-keys", "rotate"],
            summary: "publish a new OpenID Provider signing key now; it signs after\n"
                + "OIDC_KEY_PREPUBLISH_SECONDS (default one day). Prints its kid"),
        CommandSpec(["oidc-keys", "list"], "[--json]", flags: ["json"]),
        CommandSpec(
            ["oidc-clients", "create"],
            "--redirect-uris URL[,URL…] [--auth-method METHOD] [--name NAME] [--scope SCOPES] [--grant-types TYPES] "
                + "[--backchannel-logout-uri URL] [--backchannel-logout-session-required]",
            summary:
                "register a relying party (METHOD client_secret_basic, client_secret_post\nor none; SCOPES from openid email profile offline_access; TYPES\nauthorization_code,refresh_token); prints its registration as JSON\n(the client_secret only this once)",
            options: ["redirect-uris", "auth-method", "name", "scope", "grant-types", "backchannel-logout-uri"],
            flags: ["backchannel-logout-session-required"]),
        CommandSpec(["oidc-clients", "list"], "[--json]", flags: ["json"]),
        CommandSpec(["oidc-clients", "delete"], "CLIENT_ID", summary: "delete a relying party and its grants", operands: 1...1),
    ]

    static func run(_ arguments: ParsedArguments, environment: [String: String]) throws -> Int32 {
        let configuration = try BrokerConfiguration.load(environment: environment, requireApple: false)
        switch arguments.command.words.joined(separator: " ") {
        case "oidc-keys rotate":
            guard let tokenKeys = configuration.tokenKeys else { throw arguments.usageError("TOKEN_ENCRYPTION_KEY is required") }
            let prepublish = configuration.oidc?.keyPrepublish ?? .seconds(86_400)
            let kid = try BrokerCommand.withDatabase(environment) {
                try SigningKeyStore(pool: $0.pool, tokenKeys: tokenKeys).rotate(prepublish: prepublish)
            }
            print(kid)
            BrokerCommand.printError(
                "published \(kid); it signs from \(RFC3339.string(from: Date().addingTimeInterval(Double(prepublish.components.seconds))))"
            )
            return 0
        case "oidc-keys list":
            guard let tokenKeys = configuration.tokenKeys else { throw arguments.usageError("TOKEN_ENCRYPTION_KEY is required") }
            let keys = try BrokerCommand.withDatabase(environment) {
                try SigningKeyStore(pool: $0.pool, tokenKeys: tokenKeys).list()
            }
            if arguments.flags.contains("json") {
                let rows = keys.map { key -> JSONValue in
                    .object([
                        "kid": .string(key.kid), "state": .string(key.state),
                        "created_at": .string(RFC3339.string(from: key.createdAt)),
                        "activates_at": .string(RFC3339.string(from: key.activatesAt)),
                        "retired_at": key.retiredAt.map { .string(RFC3339.string(from: $0)) } ?? .null,
                    ])
                }
                print(String(decoding: JSONValue.array(rows).serialized(), as: UTF8.self))
            } else {
                print("KID\tSTATE\tCREATED\tACTIVATES\tRETIRED")
                for key in keys {
                    let retired = key.retiredAt.map(RFC3339.string(from:)) ?? "-"
                    print(
                        "\(key.kid)\t\(key.state)\t\(RFC3339.string(from: key.createdAt))\t\(RFC3339.string(from: key.activatesAt))\t\(retired)"
                    )
                }
            }
            return 0
        case "oidc-clients create":
            func list(_ name: String) -> [String]? {
                arguments.options[name].map { $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } }
            }
            let allowPrivate = configuration.dispatch.allowPrivateNetworks
            let metadata: ClientMetadata
            do {
                metadata = try ClientMetadata(
                    redirectURIs: list("redirect-uris"), tokenEndpointAuthMethod: arguments.options["auth-method"],
                    grantTypes: list("grant-types"), responseTypes: nil, clientName: arguments.options["name"],
                    scope: arguments.options["scope"], backchannelLogoutURI: arguments.options["backchannel-logout-uri"],
                    backchannelLogoutSessionRequired: arguments.flags.contains("backchannel-logout-session-required"),
                    logoutURI: { try WebhookSubscriptionStore.validate(url: $0, allowPrivateNetworks: allowPrivate) })
            } catch let error as OAuthError {
                throw arguments.usageError("\(error.code): \(error.description)")
            }
            let (client, secret) = try BrokerCommand.withDatabase(environment) {
                try ClientStore(pool: $0.pool).create(metadata, createdBy: "cli")
            }
            guard case .object(var members) = client.json else { preconditionFailure("a client is a JSON object") }
            if let secret { members["client_secret"] = .string(secret) }
            print(String(decoding: JSONValue.object(members).serialized(), as: UTF8.self))
            return 0
        case "oidc-clients list":
            let clients = try BrokerCommand.withDatabase(environment) { try ClientStore(pool: $0.pool).list() }
            if arguments.flags.contains("json") {
                print(String(decoding: JSONValue.array(clients.map(\.json)).serialized(), as: UTF8.self))
            } else {
                print("CLIENT_ID\tNAME\tAUTH_METHOD\tREDIRECT_URIS\tCREATED")
                for client in clients {
                    let metadata = client.metadata
                    print(
                        "\(client.clientID)\t\(metadata.clientName ?? "-")\t\(metadata.tokenEndpointAuthMethod)\t"
                            + "\(metadata.redirectURIs.joined(separator: ","))\t\(RFC3339.string(from: client.createdAt))")
                }
            }
            return 0
        case "oidc-clients delete":
            let id = arguments.operands[0]
            guard try BrokerCommand.withDatabase(environment, { try ClientStore(pool: $0.pool).delete(id) }) else {
                BrokerCommand.printError("no OpenID client with id \(id)")
                return 1
            }
            BrokerCommand.printError("deleted \(id)")
            return 0
        default:
            preconditionFailure("\(arguments.command.words) has no handler")
        }
    }
}
