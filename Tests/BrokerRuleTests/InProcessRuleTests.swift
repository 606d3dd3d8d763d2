import AppleID
import BrokerAPI
import BrokerCore
import BrokerCrypto
import Foundation
import HTTPServer
import JOSE
import Observability
import StrictJSON
import TestSupport
import Testing

// The fast layer: rules checked in process, with no PostgreSQL and no socket, so a change
// to a rule is known in seconds (docs/testing.md: `swift test --filter
// "AppleIDTests|NotificationRuleTests|ProblemMappingTests|SealedTokenTests"`).

@Suite("Notification claim rules in process")
struct NotificationRuleTests {
    @Test("notifications and identity tokens share Apple's iss, aud and time rules")
    func sharedClaimRules() throws {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let base: [String: JSONValue] = [
            "iss": "https://appleid.apple.com", "aud": "com.example.app", "iat": .integer(1_800_000_000),
            "jti": "j1", "events": .string(#"{"type":"email-disabled","sub":"s1","event_time":1800000000000}"#),
        ]
        func verdict(_ change: (inout [String: JSONValue]) -> Void) -> String {
            var claims = base
            change(&claims)
            do {
                _ = try NotificationReceiver.decode(
                    claims: AppleClaims(
                        payload: JSONValue.object(claims).serialized(), leeway: 60, now: now.timeIntervalSince1970),
                    clientIDs: ["com.example.app"])
                return "accept"
            } catch let rejection as TokenRejection {
                return rejection.code.rawValue
            } catch let error as BrokerError {
                return error.code.rawValue
            } catch {
                return "\(error)"
            }
        }
        #expect(verdict { _ in } == "accept")
        #expect(verdict { $0["iss"] = "https://appleid.apple.com.evil" } == "token_issuer_invalid")
        #expect(verdict { $0["aud"] = "com.other.app" } == "token_audience_invalid")
        #expect(verdict { $0["aud"] = .array(["com.other.app", "com.example.app"]) } == "accept")
        #expect(verdict { $0["iat"] = .integer(1_800_000_000 + 120) } == "token_not_yet_valid")
        #expect(verdict { $0["iat"] = nil } == "token_malformed")
        #expect(verdict { $0["exp"] = .integer(1_800_000_000 - 120) } == "token_expired")
        #expect(verdict { $0["exp"] = "soon" } == "token_malformed")
        #expect(verdict { $0["events"] = .object(["type": "consent-revoked", "sub": "s1"]) } == "accept")
        #expect(verdict { $0["events"] = nil } == "notification_malformed")
    }
}

@Suite("Problem mapping in process")
struct ProblemMappingTests {
    /// A server that is never started: `respond(to:)` routes as a connection would.
    private func server(_ register: (inout Router) -> Void) -> HTTPServer {
        var router = Router()
        register(&router)
        var configuration = HTTPServer.Configuration()
        configuration.problemTypeBase = BrokerApplication.problemTypeBase
        return HTTPServer(
            configuration: configuration, router: router, logger: Logger(label: "t", sink: .capturing()),
            metrics: MetricsRegistry(), errorMapper: ProblemCatalog.problem(for:))
    }

    private func json(_ response: HTTPResponse) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any])
    }

    @Test("every domain code answers as a problem with its code, a 4xx or 5xx status and a title")
    func everyCode() throws {
        let server = server { router in
            router.get("/fail/{code}") { request in
                throw BrokerError(BrokerError.Code(rawValue: try request.parameter("code"))!, "detail")
            }
        }
        for code in BrokerError.Code.allCases {
            let response = server.respond(to: HTTPRequest(method: .get, path: "/fail/\(code.rawValue)"))
            let body = try json(response)
            #expect((400..<600).contains(response.status), "\(code)")
            #expect(response.headers["Content-Type"] == "application/problem+json")
            #expect(body["code"] as? String == code.rawValue)
            #expect(body["status"] as? Int == response.status)
            #expect(!(body["title"] as? String ?? "").isEmpty)
            #expect(body["type"] as? String == "urn:appleid-broker:problem:\(code.rawValue)")
            #expect(code.isRefusal == (response.status < 500), "\(code): a refusal is 4xx, a failing dependency 5xx")
        }
    }

    @Test("headers and members a client acts on: WWW-Authenticate, Retry-After, deletion_id; field errors name the field")
    func details() throws {
        let server = server { router in
            router.get("/key") { _ in throw BrokerError(.unauthorized, "send an API key") }
            router.get("/apple") { _ in throw BrokerError(.appleUnavailable, "down", retryAfterSeconds: 5) }
            router.get("/deleted") { _ in throw BrokerError(.userDeleted, "gone", extensions: ["deletion_id": "d1"]) }
            router.post("/body") { request in
                _ = try request.jsonObject().requiredString("identity_token")
                return .noContent
            }
            router.get("/token") { _ in throw TokenRejection(.nonceMismatch, "no") }
            router.get("/malformed") { _ in throw TokenRejection(.tokenMalformed, "no") }
        }
        let key = server.respond(to: HTTPRequest(method: .get, path: "/key"))
        #expect(key.status == 401 && key.headers["WWW-Authenticate"]?.hasPrefix("Bearer") == true)
        let apple = server.respond(to: HTTPRequest(method: .get, path: "/apple"))
        #expect(apple.status == 503 && apple.headers["Retry-After"] == "5")
        let deleted = server.respond(to: HTTPRequest(method: .get, path: "/deleted"))
        #expect(deleted.status == 410)
        #expect(try json(deleted)["deletion_id"] as? String == "d1")
        let body = server.respond(
            to: HTTPRequest(
                method: .post, path: "/body", headers: ["Content-Type": "application/json"], body: Array(#"{"x":1}"#.utf8)))
        #expect(body.status == 400)
        #expect(try json(body)["code"] as? String == "invalid_request")
        #expect(try json(body)["detail"] as? String == "field `identity_token` is required")
        #expect(server.respond(to: HTTPRequest(method: .get, path: "/token")).status == 401)
        #expect(server.respond(to: HTTPRequest(method: .get, path: "/malformed")).status == 400)
        #expect(server.respond(to: HTTPRequest(method: .get, path: "/nowhere")).status == 404)
        #expect(server.respond(to: HTTPRequest(method: .delete, path: "/key")).status == 405)
    }
}

@Suite("Sealed tokens in process")
struct SealedTokenTests {
    @Test("a sealed token opens only for its owner and its kind, and not under another key")
    func binding() throws {
        let keys = try TokenKeyRing(parsing: Data(SecureRandom.bytes(32)).base64EncodedString())
        let owner = SealedAppleToken.Owner(teamID: "TEAM000001", sub: "001.a", clientID: "com.example.app")
        let sealed = try SealedAppleToken(sealing: "r.token", as: .refresh, for: owner, keys: keys)
        #expect(try sealed.open(for: owner, keys: keys) == "r.token")
        #expect(!sealed.sealed.isEmpty && !sealed.sealed.contains(subsequence: Array("r.token".utf8)))
        var other = owner
        other.sub = "001.b"
        #expect(throws: (any Error).self) { try sealed.open(for: other, keys: keys) }
        other = owner
        other.clientID = "com.example.web"
        #expect(throws: (any Error).self) { try sealed.open(for: other, keys: keys) }
        // A refresh token's ciphertext moved into the access-token column does not open there.
        let moved = SealedAppleToken(.access, sealed: sealed.sealed, keyID: sealed.keyID)
        #expect(throws: (any Error).self) { try moved.open(for: owner, keys: keys) }
        let otherKeys = try TokenKeyRing(parsing: Data(SecureRandom.bytes(32)).base64EncodedString())
        #expect(throws: (any Error).self) { try sealed.open(for: owner, keys: otherKeys) }
    }
}

extension Array where Element == UInt8 {
    fileprivate func contains(subsequence: [UInt8]) -> Bool {
        guard subsequence.count <= count else { return false }
        return (0...(count - subsequence.count)).contains { self[$0..<($0 + subsequence.count)].elementsEqual(subsequence) }
    }
}
