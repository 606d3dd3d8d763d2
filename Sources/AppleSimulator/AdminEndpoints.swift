import BrokerCrypto
import Foundation
import HTTPServer
import JOSE
import StrictJSON
import Synchronization

/// The simulator's own control API under `/sim/` (not Apple's): create users and tokens,
/// rotate keys, send notifications, set faults, and read what happened.
enum AdminEndpoints {
    struct TeamRegistration: Codable {
        var teamID: String
        var keyID: String
        /// The `.p8` (private; only its public half is kept) or a public-key PEM.
        var keyPEM: String
        var clientIDs: [String]
        /// Registered Return URLs per Services ID (web sign-in).
        var returnURLs: [String: [String]]?

        enum CodingKeys: String, CodingKey {
            case teamID = "team_id"
            case keyID = "key_id"
            case keyPEM = "key_pem"
            case clientIDs = "client_ids"
            case returnURLs = "return_urls"
        }
    }

    struct UserCreation: Codable {
        var teamID: String?
        var email: String?
        var realUserStatus: Int?

        enum CodingKeys: String, CodingKey {
            case teamID = "team_id"
            case email
            case realUserStatus = "real_user_status"
        }
    }

    struct CodeCreation: Codable {
        var teamID: String?
        var sub: String
        var clientID: String
        var redirectURI: String?

        enum CodingKeys: String, CodingKey {
            case teamID = "team_id"
            case sub
            case clientID = "client_id"
            case redirectURI = "redirect_uri"
        }
    }

    struct ConsentRevocation: Codable {
        var teamID: String?
        var sub: String
        /// Only this client id's app group; absent: every app of the team.
        var clientID: String?

        enum CodingKeys: String, CodingKey {
            case teamID = "team_id"
            case sub
            case clientID = "client_id"
        }
    }

    struct AppTransfer: Codable {
        var clientIDs: [String]
        var fromTeam: String
        var toTeam: String

        enum CodingKeys: String, CodingKey {
            case clientIDs = "client_ids"
            case fromTeam = "from_team"
            case toTeam = "to_team"
        }
    }

    struct BatchRequest: Codable {
        var count: Int
        var users: Int
        var clientID: String
        var lifetime: Int?
        /// Distinct users `first_user`, `first_user + 1`, … instead of random draws from `users`
        /// (first logins: every token a user the broker has not seen).
        var firstUser: Int?
        /// Also issue an authorization code per token (its `c_hash` in the token); each line is
        /// then `token code` (code-exchange benchmarks).
        var withCode: Bool?

        enum CodingKeys: String, CodingKey {
            case count, users
            case clientID = "client_id"
            case lifetime
            case firstUser = "first_user"
            case withCode = "with_code"
        }
    }

    struct NotificationBatch: Codable {
        var count: Int
        var users: Int
        var clientID: String
        var types: [String]?

        enum CodingKeys: String, CodingKey {
            case count, users, types
            case clientID = "client_id"
        }
    }

    static func register(on router: inout Router, simulator: AppleSimulator) {
        // Benchmark fixtures: `count` signed notification bodies (`{"payload":…}`, one per
        // line) for subs drawn from the same `users` range as /sim/tokens/batch.
        router.post("/sim/notifications/batch") { request in
            let batch = try request.decodeJSON(NotificationBatch.self)
            guard (1...1_000_000).contains(batch.count), (1...10_000_000).contains(batch.users) else {
                throw Problem.badRequest("count must be 1…1,000,000 and users 1…10,000,000")
            }
            return .text(try simulator.signNotificationBatch(batch).joined(separator: "\n") + "\n")
        }
        // Benchmark fixtures: `count` tokens over `users` distinct subs, one per line.
        router.post("/sim/tokens/batch") { request in
            let batch = try request.decodeJSON(BatchRequest.self)
            guard (1...1_000_000).contains(batch.count), (1...10_000_000).contains(batch.users) else {
                throw Problem.badRequest("count must be 1…1,000,000 and users 1…10,000,000")
            }
            return .text(try simulator.mintBatch(batch).joined(separator: "\n") + "\n")
        }
        router.post("/sim/teams") { request in
            let registration = try request.decodeJSON(TeamRegistration.self)
            let publicKey = try AppleSimulator.publicKey(fromPEM: registration.keyPEM)
            simulator.registerTeam(
                teamID: registration.teamID, keyID: registration.keyID, publicKey: publicKey,
                clientIDs: registration.clientIDs)
            for (clientID, urls) in registration.returnURLs ?? [:] {
                simulator.registerReturnURLs(clientID: clientID, urls: urls)
            }
            return .json(["team_id": registration.teamID], status: 201)
        }
        router.post("/sim/users") { request in
            let creation = try request.decodeJSON(UserCreation.self)
            return .json(
                simulator.createUser(
                    teamID: creation.teamID, email: creation.email, realUserStatus: creation.realUserStatus ?? 2),
                status: 201)
        }
        router.post("/sim/tokens") { request in
            .json(try simulator.mintToken(try request.decodeJSON(TokenRequest.self)), status: 201)
        }
        router.post("/sim/codes") { request in
            let creation = try request.decodeJSON(CodeCreation.self)
            let code = simulator.issueCode(
                teamID: creation.teamID, sub: creation.sub, clientID: creation.clientID, redirectURI: creation.redirectURI)
            return .json(["code": code], status: 201)
        }
        router.post("/sim/consent/revoke") { request in
            let revocation = try request.decodeJSON(ConsentRevocation.self)
            return .json([
                "revoked": simulator.revokeConsent(teamID: revocation.teamID, sub: revocation.sub, clientID: revocation.clientID)
            ])
        }
        router.post("/sim/users/password-change") { request in
            let change = try request.decodeJSON(ConsentRevocation.self)
            return .json(["dead_tokens": simulator.changePassword(teamID: change.teamID, sub: change.sub)])
        }
        router.post("/sim/teams/transfer-app") { request in
            let transfer = try request.decodeJSON(AppTransfer.self)
            guard !transfer.clientIDs.isEmpty, transfer.fromTeam != transfer.toTeam else {
                throw Problem.badRequest("client_ids must name at least one client id, and the teams must differ")
            }
            simulator.transferApp(clientIDs: transfer.clientIDs, from: transfer.fromTeam, to: transfer.toTeam)
            return .json(transfer)
        }
        router.on(.put, "/sim/app-groups") { request in
            let groups = try request.decodeJSON([[String]].self)
            simulator.setAppGroups(groups)
            return .json(["groups": groups.count])
        }
        router.post("/sim/keys/rotate") { _ in
            .json(["kid": try simulator.rotateKeys()])
        }
        router.post("/sim/keys/retire") { _ in
            .json(["retired": simulator.retireOldKeys()])
        }
        router.post("/sim/notifications") { request in
            .json(try simulator.sendNotification(try request.decodeJSON(NotificationRequest.self)))
        }
        // The notifications Apple sent on its own (a user's revocation), every attempt.
        router.get("/sim/notifications/deliveries") { _ in
            .json(simulator.notificationDeliveries)
        }
        router.get("/sim/revocations") { _ in
            .json(simulator.revocations)
        }
        router.delete("/sim/revocations") { _ in
            simulator.clearRevocations()
            return .noContent
        }
        router.get("/sim/stats") { _ in
            .json(simulator.statistics)
        }
        router.get("/sim/faults") { _ in
            .json(simulator.faults)
        }
        router.on(.put, "/sim/faults") { request in
            simulator.faults = try request.decodeJSON(FaultSettings.self)
            return .json(simulator.faults)
        }
    }
}

extension AppleSimulator {
    /// The public key of a `.p8` private key, or a public key given as SubjectPublicKeyInfo PEM.
    public static func publicKey(fromPEM pem: String) throws -> AsymmetricKey {
        if pem.contains("PRIVATE KEY") {
            let privateKey = try AsymmetricKey.privateKey(pem: pem)
            let (x, y) = try privateKey.p256Coordinates()
            return try AsymmetricKey.p256PublicKey(x: x, y: y)
        }
        let body = pem.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
        guard let der = Data(base64Encoded: body) else {
            throw Problem.badRequest("key_pem is neither a PKCS#8 private key nor a public-key PEM")
        }
        return try AsymmetricKey.publicKey(der: Array(der))
    }
}
