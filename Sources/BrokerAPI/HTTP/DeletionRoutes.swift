import BrokerCore
import Foundation
import HTTPServer
import PostgresClient
import StrictJSON

/// The compliance API (scope `compliance`): `POST /v1/deletions`, `GET /v1/deletions/{id}`,
/// `GET /v1/deletions?state=…`, `POST /v1/deletions/{id}/retry`.
enum DeletionRoutes {
    static func register(on router: inout Router, service: DeletionService, keys: APIKeyAuthenticator) {
        router.group(keys.requiring(.compliance)) { router in routes(on: &router, service: service) }
    }

    private static func routes(on router: inout Router, service: DeletionService) {
        router.post(
            "/v1/deletions",
            authenticated { request, key in
                let body = try request.jsonObject()
                let result = try service.request(
                    try DeletionService.Request(body), source: .api, actor: "api:\(key.id)", visibleTo: key)
                return .json(
                    .object([
                        "deletion_id": .string(result.id.lowercasedString), "state": .string(result.state.rawValue),
                        "created": .bool(result.created),
                    ]), status: 202)
            })
        router.get(
            "/v1/deletions",
            authenticated { request, key in
                let state = try request.stateParameter(DeletionState.self)
                let limit = try request.limitParameter()
                return .json(
                    .object([
                        "deletions": .array(try service.store.list(state: state, limit: limit, reach: key.reachArray).map(\.json))
                    ]))
            })
        router.get(
            "/v1/deletions/{id}",
            authenticated { request, key in
                let id = try deletionID(request)
                guard try AppReach.deletion(id, visibleTo: key, pool: service.store.pool),
                    let record = try service.store.record(id)
                else {
                    throw notFound
                }
                return .json(record.json)
            })
        router.post(
            "/v1/deletions/{id}/retry",
            authenticated { request, key in
                let id = try deletionID(request)
                guard try AppReach.deletion(id, visibleTo: key, pool: service.store.pool), try service.store.record(id) != nil
                else {
                    throw notFound
                }
                guard try service.retry(id, by: "api:\(key.id)") else {
                    throw BrokerError(.deletionNotFailed, "only failed deletions can be retried")
                }
                return .json(.object(["deletion_id": .string(id.lowercasedString), "state": "requested"]), status: 202)
            })
    }

    static let notFound = BrokerError(.deletionNotFound, "no deletion with this id")

    static func deletionID(_ request: HTTPRequest) throws -> UUID {
        try request.uuidParameter("id", invalid: .invalidDeletionID, naming: "deletion id")
    }
}
