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
                + "[--backchannel-logout-uri URL] [--backchannel-logout-session-required] [--jwks-uri URL | --jwks FILE] "
                + "[--private-network-http-redirects] [--post-logout-redirect-uris URL[,URL…]]",
            summary:
                "register a relying party (METHOD client_secret_basic, client_secret_post,\nprivate_key_jwt with --jwks-uri or --jwks, or none; SCOPES from openid\nemail profile offline_access; TYPES authorization_code,refresh_token);\n--private-network-http-redirects allows plain-http redirect URIs on\nprivate-network hosts (home labs; see docs/oidc.md for the risk); prints\nits registration as JSON (the client_secret only this once)",
            options: [
                "redirect-uris", "auth-method", "name", "scope", "grant-types", "backchannel-logout-uri", "jwks-uri", "jwks",
                "post-logout-redirect-uris",
            ],
            flags: ["backchannel-logout-session-required", "private-network-http-redirects"]),
        CommandSpec(["oidc-clients", "list"], "[--json]", flags: ["json"]),
        CommandSpec(["oidc-clients", "delete"], "CLIENT_ID", summary: "delete a relying party and its grants", operands: 1...1),
        CommandSpec(
            ["oidc-resource-servers", "create"], "--client-ids CLIENT_ID[,CLIENT_ID…] [--name NAME]",
            summary:
                "register a resource server that may introspect (RFC 7662) the access\ntokens of these relying parties; prints it as JSON with its secret\n(shown only this once)",
            options: ["client-ids", "name"]),
        CommandSpec(["oidc-resource-servers", "list"], "[--json]", flags: ["json"]),
        CommandSpec(
            ["oidc-resource-servers", "delete"], "RESOURCE_SERVER_ID", summary: "delete a resource server", operands: 1...1),
    ]

    static func run(_ arguments: ParsedArguments, environment: [String: String]) throws -> Int32 {
        let configuration = try BrokerConfiguration.load(environment: environment, requireApple: false)
        switch arguments.command.words.joined(separator: " ") {
        case "oidc-keys rotate":
            guard let tokenKeys = configuration.tokenKeys else { throw arguments.usageError("TOKEN_ENCRYPTION_KEY is required") }
            let prepublish = configuration.oidc?.keyPrepublish ?? .seconds(86_400)
            let kid = try BrokerCommand.withDatabase(environment) {
                try SigningKeyStore(pool: $0.pool, tokenKeys: tokenKeys).rotate(prepublish: prepublish, actor: "cli")
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
                print(String(decoding: JSONValue.array(SigningKeyStore.summaries(keys)).serialized(), as: UTF8.self))
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
            var metadata: ClientMetadata
            do {
                let jwks = try arguments.options["jwks"].map { path -> JSONValue in
                    guard let data = FileManager.default.contents(atPath: path), data.count <= 64 * 1024,
                        let value = try? JSONValue.parse(Array(data))
                    else { throw arguments.usageError("--jwks: \(path) is not a readable JWK Set (JSON, at most 64 KiB)") }
                    return value
                }
                metadata = try ClientMetadata(
                    redirectURIs: list("redirect-uris"), tokenEndpointAuthMethod: arguments.options["auth-method"],
                    grantTypes: list("grant-types"), responseTypes: nil, clientName: arguments.options["name"],
                    scope: arguments.options["scope"], backchannelLogoutURI: arguments.options["backchannel-logout-uri"],
                    backchannelLogoutSessionRequired: arguments.flags.contains("backchannel-logout-session-required"),
                    jwks: jwks, jwksURI: arguments.options["jwks-uri"],
                    privateNetworkHTTPRedirects: arguments.flags.contains("private-network-http-redirects"),
                    outboundURL: { try WebhookSubscriptionStore.validate(url: $0, allowPrivateNetworks: allowPrivate) })
                try metadata.setPostLogoutRedirectURIs(list("post-logout-redirect-uris") ?? [])
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
            guard try BrokerCommand.withDatabase(environment, { try ClientStore(pool: $0.pool).delete(id, actor: "cli") }) else {
                BrokerCommand.printError("no OpenID client with id \(id)")
                return 1
            }
            BrokerCommand.printError("deleted \(id)")
            return 0
        case "oidc-resource-servers create":
            guard let ids = arguments.options["client-ids"] else { throw arguments.usageError("--client-ids is required") }
            let clientIDs = ids.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
            let created: (ResourceServerStore.ResourceServer, String)
            do {
                created = try BrokerCommand.withDatabase(environment) {
                    try ResourceServerStore(pool: $0.pool).create(
                        name: arguments.options["name"], clientIDs: clientIDs, actor: "cli")
                }
            } catch let error as OAuthError {
                throw arguments.usageError("\(error.code): \(error.description)")
            } catch let error as BrokerError where error.code == .oidcClientNotFound {
                throw arguments.usageError(error.detail)
            }
            guard case .object(var members) = created.0.json else { preconditionFailure("a resource server is an object") }
            members["secret"] = .string(created.1)
            print(String(decoding: JSONValue.object(members).serialized(), as: UTF8.self))
            return 0
        case "oidc-resource-servers list":
            let servers = try BrokerCommand.withDatabase(environment) { try ResourceServerStore(pool: $0.pool).list() }
            if arguments.flags.contains("json") {
                print(String(decoding: JSONValue.array(servers.map(\.json)).serialized(), as: UTF8.self))
            } else {
                print("RESOURCE_SERVER_ID\tNAME\tCLIENT_IDS\tCREATED")
                for server in servers {
                    print(
                        "\(server.id)\t\(server.name ?? "-")\t\(server.clientIDs.joined(separator: ","))\t"
                            + RFC3339.string(from: server.createdAt))
                }
            }
            return 0
        case "oidc-resource-servers delete":
            let id = arguments.operands[0]
            guard try BrokerCommand.withDatabase(environment, { try ResourceServerStore(pool: $0.pool).delete(id, actor: "cli") })
            else {
                BrokerCommand.printError("no resource server with id \(id)")
                return 1
            }
            BrokerCommand.printError("deleted \(id)")
            return 0
        default:
            preconditionFailure("\(arguments.command.words) has no handler")
        }
    }
}
