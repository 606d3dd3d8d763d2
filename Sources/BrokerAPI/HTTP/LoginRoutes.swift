import BrokerCore
import Foundation
import HTTPServer
import PostgresClient
import StrictJSON

/// `POST /v1/apple/login` (scope `login`), `GET /v1/users/{id}` and
/// `GET /v1/users/{id}/credential-state` (scope `read`).
enum LoginRoutes {
    static func register(
        on router: inout Router, login loginService: LoginService, users: UserDirectory, keys: APIKeyAuthenticator
    ) {
        router.group(keys.requiring(.login)) { router in
            router.post(
                "/v1/apple/login",
                authenticated { request, key in
                    var login = try LoginRequest(request.jsonObject())
                    login.allowedClientIDs = key.reach
                    return .json(try loginService.login(login).json)
                })
        }
        router.group(keys.requiring(.read)) { router in userRoutes(on: &router, users: users) }
    }

    private static func userRoutes(on router: inout Router, users: UserDirectory) {
        router.get(
            "/v1/users/{id}",
            authenticated { request, key in
                let id = try userID(request)
                guard try users.isVisible(id, to: key) else { throw BrokerError.userNotFound }
                if let user = try users.user(id, for: key) { return .json(user.json) }
                if let deletion = try users.deletion(ofPurgedUser: id) {
                    throw BrokerError.userDeleted("this user was deleted", deletionID: deletion.lowercasedString)
                }
                throw BrokerError.userNotFound
            })
        router.get(
            "/v1/users/{id}/credential-state",
            authenticated { request, key in
                let id = try userID(request)
                guard try users.isVisible(id, to: key) else { throw BrokerError.userNotFound }
                let clientID = request.query["client_id"]
                if let clientID, !isClientID(clientID) {
                    throw BrokerError(.invalidClientID, "client_id must be a bundle ID or Services ID")
                }
                return .json(
                    .object([
                        "user_id": .string(id.lowercasedString),
                        "state": .string(try users.credentialState(id, clientID: clientID, for: key).rawValue),
                    ]))
            })
    }

    /// A bundle ID or Services ID as Apple allows them: ASCII letters, digits, hyphens and periods
    /// (CFBundleIdentifier's rule, which Services IDs follow), 1 to 255 of them. docs/openapi.json
    /// states exactly this (`^[A-Za-z0-9.-]{1,255}$`), so a schema-valid client id is never refused.
    static func isClientID(_ text: String) -> Bool {
        (1...255).contains(text.utf8.count)
            && text.utf8.allSatisfy { byte in
                switch byte {
                case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                    UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "."), UInt8(ascii: "-"):
                    true
                default: false
                }
            }
    }

    static func userID(_ request: HTTPRequest) throws -> UUID {
        try request.uuidParameter("id", invalid: .invalidUserID, naming: "user id")
    }
}
