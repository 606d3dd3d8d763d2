import BrokerCrypto
import Foundation
import HTTPClient
import HTTPServer
import JOSE
import Locking
import StrictJSON
import Synchronization

/// Apple's answers for `/auth/*`: form-encoded requests, `client_secret_post` only,
/// `{"error": …}` bodies with status 400.
enum AppleEndpoints {
    static func register(on router: inout Router, simulator: AppleSimulator) {
        router.get("/auth/keys") { _ in
            try simulator.withFaults("keys") {
                let body = simulator.faults.emptyKeySet ? Array(#"{"keys":[]}"#.utf8) : try simulator.keySet.publicJSON()
                return HTTPResponse(status: 200, headers: ["Content-Type": "application/json"], body: body)
            }
        }
        router.post("/auth/token") { request in
            try simulator.withFaults("token") {
                return simulator.token(request)
            }
        }
        router.post("/auth/revoke") { request in
            try simulator.withFaults("revoke") {
                return simulator.revoke(request)
            }
        }
        router.get("/auth/authorize") { request in
            try simulator.withFaults("authorize") {
                return simulator.authorize(request)
            }
        }
        router.post("/auth/usermigrationinfo") { request in
            try simulator.withFaults("migration") {
                return simulator.migrationInfo(request)
            }
        }
    }
}

/// An Apple error answer.
struct AppleError: Error {
    let error: String
    let description: String?

    init(_ error: String, _ description: String? = nil) {
        self.error = error
        self.description = description
    }

    var response: HTTPResponse {
        var body: [String: JSONValue] = ["error": .string(error)]
        if let description { body["error_description"] = .string(description) }
        return HTTPResponse(
            status: 400,
            headers: ["Content-Type": "application/json", "Cache-Control": "no-store", "Pragma": "no-cache"],
            body: JSONValue.object(body).serialized())
    }
}

extension AppleSimulator {
    /// Applies latency, injected errors and stalls to an endpoint's answer.
    func withFaults(_ endpoint: String, _ answer: () throws -> HTTPResponse) throws -> HTTPResponse {
        state.withLock { state in
            switch endpoint {
            case "keys": state.statistics.keys += 1
            case "token": state.statistics.token += 1
            case "revoke": state.statistics.revoke += 1
            case "migration": state.statistics.migration += 1
            default: state.statistics.authorize += 1
            }
        }
        let faults = self.faults
        let applies = faults.endpoints.isEmpty || faults.endpoints.contains(endpoint)
        if applies && faults.latencyMilliseconds > 0 {
            Thread.sleep(forTimeInterval: Double(faults.latencyMilliseconds) / 1000)
        }
        if applies && faults.timeoutRate > 0 && Double.random(in: 0..<1) < faults.timeoutRate {
            // Apple may finish the work and lose only the answer (a code is then used up).
            if faults.timeoutAfterWork { _ = try answer() }
            Thread.sleep(forTimeInterval: Double(faults.timeoutMilliseconds) / 1000)
            return HTTPResponse(status: 504)
        }
        if applies && faults.errorRate > 0 && Double.random(in: 0..<1) < faults.errorRate,
            let status = faults.errorStatuses.randomElement()
        {
            var headers: HTTPHeaders = ["Content-Type": "text/plain"]
            if status == 429 || status == 503 {
                headers.set(
                    "Retry-After",
                    faults.retryAfterAsDate
                        ? Self.httpDate(secondsFromNow: faults.retryAfterSeconds) : String(faults.retryAfterSeconds))
            }
            if endpoint == "revoke" {
                state.withLock {
                    $0.revocations.append(
                        RevocationRecord(clientID: "", tokenTypeHint: nil, token: "", outcome: "fault", sub: nil))
                }
            }
            return HTTPResponse(status: status, headers: headers, body: Array("simulated failure".utf8))
        }
        // An intermittent request defect (issue 35): a share of calls, whatever the token.
        if applies, endpoint == "token" || endpoint == "revoke", drawsRequestError(faults) {
            return Self.malformedRequest.response
        }
        return try answer()
    }

    /// An IMF-fixdate `seconds` from now (RFC 9110 §5.6.7).
    static func httpDate(secondsFromNow seconds: Int) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        return formatter.string(from: Date().addingTimeInterval(TimeInterval(seconds)))
    }

    /// Parses a form body; Apple refuses anything else (a JSON body gets `invalid_client`).
    func form(_ request: HTTPRequest) throws -> [String: String] {
        guard request.mediaType == "application/x-www-form-urlencoded" else { throw AppleError("invalid_client") }
        return FormEncoding.fields(String(decoding: request.body, as: UTF8.self))
    }

    /// Checks `client_id` and `client_secret` as Apple does and returns the client's team.
    func authenticateClient(_ fields: [String: String]) throws -> Team {
        guard let clientID = fields["client_id"], !clientID.isEmpty,
            let secret = fields["client_secret"], !secret.isEmpty
        else { throw AppleError("invalid_client") }
        let header: JWSHeader
        do {
            header = try JWSVerifier(maximumBytes: 8192).unverifiedHeader(secret)
        } catch {
            throw AppleError("invalid_client")
        }
        guard let keyID = header.keyID,
            let team = state.withLock({ state in state.teams.values.first { $0.keys[keyID] != nil } }),
            let publicKey = team.keys[keyID]
        else { throw AppleError("invalid_client") }
        let claims: [String: JSONValue]
        do {
            let verified = try JWSVerifier(allowedAlgorithms: [.es256]).verify(secret, key: JWK(key: publicKey, keyID: keyID))
            claims = try verified.claims()
        } catch {
            throw AppleError("invalid_client")
        }
        let now = Int64(Date().timeIntervalSince1970)
        let audience = claims["aud"]?.stringValue ?? claims["aud"]?.arrayValue?.first?.stringValue
        guard claims["iss"]?.stringValue == team.teamID,
            claims["sub"]?.stringValue == clientID,
            audience == Self.issuer,
            let issuedAt = claims["iat"]?.integerValue, let expires = claims["exp"]?.integerValue,
            issuedAt <= now + 60, expires > now, expires - issuedAt <= Int64(Self.maximumClientSecretLifetime),
            team.clientIDs.contains(clientID)
        else { throw AppleError("invalid_client") }
        return team
    }

    /// TN3107's `invalid_request` for a defective request, worded as no revocation.
    static let malformedRequest = AppleError("invalid_request", "Invalid request.")

    func token(_ request: HTTPRequest) -> HTTPResponse {
        do {
            let fields = try form(request)
            let team = try authenticateClient(fields)
            if faults.forceInvalidClient { throw AppleError("invalid_client") }
            if faults.malformedRequest && faults.hits("token") { throw Self.malformedRequest }
            let clientID = fields["client_id"]!
            switch fields["grant_type"] {
            case "authorization_code":
                return try codeGrant(fields, team: team, clientID: clientID)
            case "refresh_token":
                return try refreshGrant(fields, team: team, clientID: clientID)
            case "client_credentials":
                guard fields["scope"] == "user.migration" else { throw AppleError("invalid_scope") }
                let accessToken = "m" + Hex.encode(SecureRandom.bytes(16)) + ".0.sim"
                state.withLock {
                    $0.grants[accessToken] = Grant(
                        teamID: team.teamID, sub: "", clientID: clientID, revoked: false, kind: "migration")
                }
                return tokenResponse(["access_token": .string(accessToken), "token_type": "Bearer", "expires_in": 3600])
            case nil:
                throw AppleError("invalid_request")
            default:
                throw AppleError("unsupported_grant_type")
            }
        } catch let error as AppleError {
            return error.response
        } catch {
            return AppleError("invalid_request").response
        }
    }

    private func codeGrant(_ fields: [String: String], team: Team, clientID: String) throws -> HTTPResponse {
        guard let code = fields["code"] else { throw AppleError("invalid_request") }
        let grant: CodeGrant = try state.withLock { state in
            guard let grant = state.codes[code], grant.teamID == team.teamID else {
                throw AppleError("invalid_grant", "The code has expired or has been revoked.")
            }
            guard !grant.used else { throw AppleError("invalid_grant", "The code has already been used.") }
            guard grant.expires > Date() else { throw AppleError("invalid_grant", "The code has expired or has been revoked.") }
            guard grant.clientID == clientID else { throw AppleError("invalid_grant", "client_id mismatch") }
            // redirect_uri only when the authorization request had one (web); never for native codes.
            guard fields["redirect_uri"] == grant.redirectURI else { throw AppleError("invalid_grant", "redirect_uri mismatch") }
            state.codes[code]?.used = true
            return grant
        }
        guard let user = user(teamID: grant.teamID, sub: grant.sub) else { throw AppleError("invalid_grant") }
        let accessToken = "a" + Hex.encode(SecureRandom.bytes(16)) + ".0.sim"
        let refreshToken = "r" + Hex.encode(SecureRandom.bytes(16)) + ".0.sim"
        state.withLock { state in
            state.grants[accessToken] = Grant(
                teamID: team.teamID, sub: user.sub, clientID: clientID, revoked: false, kind: "access_token")
            state.grants[refreshToken] = Grant(
                teamID: team.teamID, sub: user.sub, clientID: clientID, revoked: false, kind: "refresh_token")
        }
        let idToken = try identityToken(
            for: user, clientID: clientID, request: nil, code: nil, accessToken: accessToken, nonce: grant.nonce)
        return tokenResponse([
            "access_token": .string(accessToken), "token_type": "Bearer", "expires_in": 3600,
            "refresh_token": .string(refreshToken), "id_token": .string(idToken),
        ])
    }

    private func refreshGrant(_ fields: [String: String], team: Team, clientID: String) throws -> HTTPResponse {
        guard let refreshToken = fields["refresh_token"] else { throw AppleError("invalid_request") }
        let faults = self.faults
        let revokedAnswer =
            faults.revokedGrantError == "invalid_request"
            ? AppleError("invalid_request", "The user has revoked authorization for the client.")
            : AppleError("invalid_grant", "The token has expired or has been revoked.")
        if faults.forceInvalidGrant { throw revokedAnswer }
        let grant: Grant = try state.withLock { state in
            guard let grant = state.grants[refreshToken], grant.kind == "refresh_token",
                grant.teamID == team.teamID, grant.clientID == clientID
            else { throw AppleError("invalid_grant", "The token has expired or has been revoked.") }
            if faults.malformedRequestSubs.contains(grant.sub) { throw Self.malformedRequest }
            if grant.revoked { throw revokedAnswer }
            if grant.dead { throw AppleError("invalid_grant", "The token has expired or has been revoked.") }
            return grant
        }
        guard let user = user(teamID: grant.teamID, sub: grant.sub) else { throw AppleError("invalid_grant") }
        let accessToken = "a" + Hex.encode(SecureRandom.bytes(16)) + ".0.sim"
        state.withLock {
            $0.grants[accessToken] = Grant(
                teamID: team.teamID, sub: user.sub, clientID: clientID, revoked: false, kind: "access_token")
        }
        // Apple sends no new refresh token on a refresh.
        let idToken = try identityToken(for: user, clientID: clientID, request: nil, code: nil, accessToken: accessToken)
        return tokenResponse([
            "access_token": .string(accessToken), "token_type": "Bearer", "expires_in": 3600, "id_token": .string(idToken),
        ])
    }

    private func tokenResponse(_ body: [String: JSONValue]) -> HTTPResponse {
        HTTPResponse(
            status: 200,
            headers: ["Content-Type": "application/json", "Cache-Control": "no-store", "Pragma": "no-cache"],
            body: JSONValue.object(body).serialized())
    }

    func revoke(_ request: HTTPRequest) -> HTTPResponse {
        do {
            let fields = try form(request)
            let team = try authenticateClient(fields)
            let clientID = fields["client_id"]!
            // TN3107: a defective request is invalid_request; revoked or invalid tokens get 200.
            if faults.malformedRequest && faults.hits("revoke") { throw Self.malformedRequest }
            guard let token = fields["token"], !token.isEmpty else { throw AppleError("invalid_request") }
            state.withLock { state in
                var record = RevocationRecord(
                    clientID: clientID, tokenTypeHint: fields["token_type_hint"], token: token, outcome: "revoked", sub: nil)
                if let grant = state.grants[token] {
                    record.sub = grant.sub
                    if grant.clientID != clientID {
                        // Apple answers 200 and does nothing (protocol reference P10).
                        record.outcome = "client_mismatch"
                    } else if grant.revoked {
                        record.outcome = "already_revoked"
                    } else if grant.dead || grant.teamID != team.teamID {
                        // Revoking needs a valid token (Apple's revoke documentation; TN3194): one a
                        // password change killed, or one issued under the team an app left in a
                        // transfer, ends nothing, and Apple still answers 200 (forum 707610;
                        // protocol reference §12.3). The user's authorization stays.
                        record.outcome = grant.dead ? "dead_token" : "other_team"
                    } else {
                        // Revoking ends the user's authorization of the whole app group: its
                        // other tokens stop refreshing too (§10.3).
                        let primary = state.primaryAppIDs[clientID] ?? clientID
                        for (other, candidate) in state.grants
                        where candidate.teamID == grant.teamID && candidate.sub == grant.sub
                            && (state.primaryAppIDs[candidate.clientID] ?? candidate.clientID) == primary
                        {
                            state.grants[other]?.revoked = true
                        }
                    }
                } else {
                    record.outcome = "unknown_token"
                }
                state.revocations.append(record)
            }
            return HTTPResponse(status: 200)
        } catch let error as AppleError {
            return error.response
        } catch {
            return AppleError("invalid_request").response
        }
    }

    /// The sender's side of a transfer: the user's transfer_sub for the `target` team, stable
    /// per (user, recipient team); refused once the transfer's 60 days are over (TN3159).
    public func transferSub(teamID: String, sub: String, to target: String) throws -> String {
        let transferSub = "000" + Hex.encode(SHA256.hash(teamID + "|" + sub + "|" + target).prefix(16)) + ".t"
        try state.withLock { state in
            if let transfer = state.transfers[transferSub] {
                guard Self.isOpen(transfer, faults: state.faults) else {
                    throw AppleError("invalid_request", "the transfer window has ended")
                }
            } else {
                // Made after the app moved (TN3159 allows 60 days): the window runs from the move.
                state.transfers[transferSub] = Transfer(
                    fromTeam: teamID, fromSub: sub, toTeam: target, toSub: nil,
                    created: state.appTransfers[teamID + "|" + target] ?? Date())
            }
        }
        return transferSub
    }

    /// The recipient's side: the user under the recipient team (made on first use, as when the
    /// transfer completes), whose tokens then carry the transfer_sub for the window.
    public func recipient(ofTransfer transferSub: String, teamID: String) throws -> SimulatedUser {
        try state.withLock { state in
            guard var transfer = state.transfers[transferSub], transfer.toTeam == teamID else {
                throw AppleError("invalid_request", "unknown transfer_sub")
            }
            // 60 days after the transfer the bridge is gone (TN3159).
            guard Self.isOpen(transfer, faults: state.faults) else {
                throw AppleError("invalid_request", "the transfer window has ended")
            }
            if let toSub = transfer.toSub, let existing = state.users[teamID + "|" + toSub] { return existing }
            let user = SimulatedUser(
                teamID: teamID, sub: SimulatedUser.makeSub(),
                email: SimulatedUser.makeRelayEmail(domain: state.faults.relayDomain ?? SimulatedUser.relayDomains[0]),
                isPrivateEmail: true, realUserStatus: 2)
            state.users[teamID + "|" + user.sub] = user
            transfer.toSub = user.sub
            state.transfers[transferSub] = transfer
            return user
        }
    }

    func migrationInfo(_ request: HTTPRequest) -> HTTPResponse {
        do {
            let fields = try form(request)
            let team = try authenticateClient(fields)
            guard let bearer = request.bearerToken,
                let grant = state.withLock({ $0.grants[bearer] }), grant.kind == "migration", grant.teamID == team.teamID,
                !grant.revoked
            else { throw AppleError("invalid_client") }
            if let sub = fields["sub"], let target = fields["target"] {
                guard user(teamID: team.teamID, sub: sub) != nil else { throw AppleError("invalid_request", "unknown sub") }
                return tokenResponse(["transfer_sub": .string(try transferSub(teamID: team.teamID, sub: sub, to: target))])
            }
            if let transferSub = fields["transfer_sub"] {
                let recipient = try recipient(ofTransfer: transferSub, teamID: team.teamID)
                return tokenResponse([
                    "sub": .string(recipient.sub), "email": .string(recipient.email ?? ""), "is_private_email": true,
                ])
            }
            throw AppleError("invalid_request")
        } catch let error as AppleError {
            return error.response
        } catch {
            return AppleError("invalid_request").response
        }
    }
}
