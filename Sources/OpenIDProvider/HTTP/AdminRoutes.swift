import BrokerCore
import Foundation
import HTTPServer
import Observability
import StrictJSON

/// The provider's part of the admin API (scope `admin`, problem documents): registrations,
/// resource servers, Back-Channel Logout deliveries and signing keys. Every route checks the
/// key's reach (AdminAccess); every change is audited with its actor, target and outcome.
enum AdminRoutes {
    static func register(on router: inout Router, provider: OpenIDProvider, admin: AdminAccess) {
        let audit = AdminAuditStore(pool: provider.clients.pool)
        /// A route for keys that reach the provider; the handler gets the audited actor.
        func route(_ action: String, _ handler: @escaping @Sendable (HTTPRequest, String) throws -> HTTPResponse) -> HTTPHandler {
            { request in
                let target = request.pathParameters["id"]
                return try handler(request, try admin.actor(request, action: action, target: target, audit: audit))
            }
        }
        /// The list, read and delete routes of one kind of registration at `path`.
        func registrations(
            _ router: inout Router, _ path: String, _ kind: String, listKey: String,
            list: @escaping @Sendable () throws -> [JSONValue], find: @escaping @Sendable (String) throws -> JSONValue?,
            delete: @escaping @Sendable (_ id: String, _ actor: String) throws -> Bool,
            afterDelete: @escaping @Sendable () -> Void = {}
        ) {
            router.get(path, route("\(kind).listed") { _, _ in .json(.object([listKey: .array(try list())])) })
            router.get(
                path + "/{id}",
                route("\(kind).read") { request, _ in
                    guard let found = try find(try request.parameter("id")) else {
                        throw Problem.notFound(path: request.path)
                    }
                    return .json(found)
                })
            router.delete(
                path + "/{id}",
                route("\(kind).deleted") { request, actor in
                    guard try delete(try request.parameter("id"), actor) else {
                        try audit.record(
                            actor: actor, action: "\(kind).deleted", target: request.pathParameters["id"], outcome: "not_found")
                        throw Problem.notFound(path: request.path)
                    }
                    afterDelete()
                    return .noContent
                })
        }
        registrations(
            &router, "/v1/oidc-clients", "oidc_client", listKey: "clients",
            list: { try provider.clients.list().map(\.json) }, find: { try provider.clients.find($0)?.json },
            delete: { try provider.clients.delete($0, actor: $1) }, afterDelete: { provider.cors.changed() })

        router.post(
            "/v1/oidc-resource-servers",
            route("oidc_resource_server.created") { request, actor in
                let body = try request.jsonObject()
                guard let clientIDs = try body.strings("client_ids") else {
                    throw BrokerError.invalidRequest("client_ids: the relying parties whose access tokens it may introspect")
                }
                do {
                    let (server, secret) = try provider.resourceServers.create(
                        name: try body.string("name"), clientIDs: clientIDs, actor: actor)
                    guard case .object(var members) = server.json else { preconditionFailure("a resource server is an object") }
                    members["secret"] = .string(secret)
                    var response = HTTPResponse.json(.object(members), status: 201)
                    response.headers.set("Cache-Control", "no-store")
                    return response
                } catch let error as OAuthError {
                    throw BrokerError.invalidRequest(error.description)
                }
            })
        registrations(
            &router, "/v1/oidc-resource-servers", "oidc_resource_server", listKey: "resource_servers",
            list: { try provider.resourceServers.list().map(\.json) }, find: { try provider.resourceServers.find($0)?.json },
            delete: { try provider.resourceServers.delete($0, actor: $1) })

        router.get(
            "/v1/oidc-keys",
            route("oidc_signing_key.listed") { _, _ in
                .json(
                    .object([
                        "keys": .array(
                            try SigningKeyStore.summaries(provider.keys.store.list()))
                    ]))
            })
        router.post(
            "/v1/oidc-keys/rotate",
            route("oidc_signing_key.rotated") { _, actor in
                let kid = try provider.keys.store.rotate(prepublish: provider.keyPrepublish, actor: actor)
                let activatesAt = Date().addingTimeInterval(Double(provider.keyPrepublish.components.seconds))
                return .json(
                    .object(["kid": .string(kid), "activates_at": .string(RFC3339.string(from: activatesAt))]), status: 201)
            })

        let logouts = provider.logoutDeliveries
        router.get(
            "/v1/oidc-logout-deliveries",
            route("oidc_logout_delivery.listed") { request, _ in
                let state = request.query["state"]
                if let state, !["pending", "delivered", "failed"].contains(state) {
                    throw BrokerError.invalidRequest("state is pending, delivered or failed")
                }
                // A limit that is not a number is refused, not replaced by the default.
                let limit =
                    try request.query["limit"].map { text in
                        guard let value = Int(text), (1...1000).contains(value) else {
                            throw BrokerError.invalidRequest("limit is 1 to 1000")
                        }
                        return value
                    } ?? 100
                return .json(.object(["deliveries": .array(try logouts.list(state: state, limit: limit))]))
            })
        router.post(
            "/v1/oidc-logout-deliveries/{id}/retry",
            route("oidc_logout_delivery.retried") { request, actor in
                let text = try request.parameter("id")
                guard let id = Int64(text), try logouts.retry(id) else {
                    // A re-drive that found no failed delivery is an act too (issue 38, item 5).
                    try audit.record(actor: actor, action: "oidc_logout_delivery.retried", target: text, outcome: "not_found")
                    throw Problem.notFound(path: request.path)
                }
                try audit.record(actor: actor, action: "oidc_logout_delivery.retried", target: text, outcome: "retried")
                return .noContent
            })
    }
}

extension SigningKeyStore {
    /// The keys as the admin API and `oidc-keys list --json` show them.
    package static func summaries(_ keys: [Summary]) -> [JSONValue] {
        keys.map { key in
            .object([
                "kid": .string(key.kid), "state": .string(key.state),
                "created_at": .string(RFC3339.string(from: key.createdAt)),
                "activates_at": .string(RFC3339.string(from: key.activatesAt)),
                "retired_at": key.retiredAt.map { .string(RFC3339.string(from: $0)) } ?? .null,
            ])
        }
    }
}
