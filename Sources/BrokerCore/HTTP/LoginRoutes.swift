import Foundation
import PostgresClient
import HTTPServer

/// `POST /v1/apple/login` (scope `login`), `GET /v1/users/{id}` and
/// `GET /v1/users/{id}/credential-state` (scope `read`).
enum LoginRoutes {
    static func register(on router: inout Router, login loginService: LoginService, users: UserDirectory, keys: APIKeyAuthenticator) {
        router.post("/v1/apple/login", keys.protect(.login) { request, key in
            var login = try LoginRequest(request.jsonObject())
            login.allowedClientIDs = key.reach
            return .json(try loginService.login(login).json)
        })
        router.get("/v1/users/{id}", keys.protect(.read) { request, key in
            let id = try UserDirectory.userID(request)
            guard try users.isVisible(id, to: key) else { throw UserDirectory.notFound }
            if let user = try users.user(id) { return .json(user) }
            if let deletion = try users.deletion(ofPurgedUser: id) {
                throw Problem(
                    status: 410, code: "user_deleted", title: "User deleted", detail: "this user was deleted",
                    extensions: ["deletion_id": deletion.lowercasedString])
            }
            throw UserDirectory.notFound
        })
        router.get("/v1/users/{id}/credential-state", keys.protect(.read) { request, key in
            let id = try UserDirectory.userID(request)
            guard try users.isVisible(id, to: key) else { throw UserDirectory.notFound }
            let clientID = request.query["client_id"]
            if let clientID, clientID.isEmpty || clientID.utf8.count > 255 {
                throw Problem.badRequest(code: "invalid_client_id", "client_id must be a bundle ID or Services ID")
            }
            return .json(["user_id": id.lowercasedString, "state": try users.credentialState(id, clientID: clientID)])
        })
    }
}
