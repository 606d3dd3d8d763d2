import BrokerCrypto
import Foundation
import HTTPClient
import JOSE
import StrictJSON
import Testing

@testable import AppleSimulator

/// Issue 35's simulator behaviour for deletions and transfers (protocol reference §12.3,
/// TN3159): a 200 from `/auth/revoke` proves nothing for a dead token, and an app that moved
/// to another team leaves its old tokens beyond the sender's reach.
extension AppleSimulatorTests {
    /// Exchanges a fresh code for `sub` (a new user when nil): the refresh and access tokens.
    func exchange(sub: String? = nil, clientID: String = clientID) throws -> (sub: String, refresh: String, access: String) {
        var mint = TokenRequest(clientID: clientID)
        mint.teamID = Self.teamID
        mint.sub = sub
        mint.withCode = true
        let minted = try simulator.mintToken(mint)
        let answer = try post(
            "/auth/token",
            form: [
                ("client_id", clientID), ("client_secret", try clientSecret(clientID: clientID)), ("code", minted.code!),
                ("grant_type", "authorization_code"),
            ])
        #expect(answer.status == 200)
        let body = try JSONValue.parseObject(answer.body)
        return (
            minted.sub, try #require(body["refresh_token"]?.stringValue), try #require(body["access_token"]?.stringValue)
        )
    }

    func refresh(_ token: String, clientID: String = clientID) throws -> HTTPClientResponse {
        try post(
            "/auth/token",
            form: [
                ("client_id", clientID), ("client_secret", try clientSecret(clientID: clientID)), ("grant_type", "refresh_token"),
                ("refresh_token", token),
            ])
    }

    func revoke(_ token: String, clientID: String = clientID) throws -> HTTPClientResponse {
        try post(
            "/auth/revoke",
            form: [
                ("client_id", clientID), ("client_secret", try clientSecret(clientID: clientID)), ("token", token),
                ("token_type_hint", "refresh_token"),
            ])
    }

    @Test("/auth/revoke of a password-changed refresh token answers 200 and revokes nothing: a later sign-in's token refreshes")
    func revokeOfDeadTokenRevokesNothing() throws {
        let first = try exchange()
        // The password change, from the command line as an operator plays it.
        #expect(
            AppleSimulatorCommand.run([
                "change-password", "--sub", first.sub, "--team", Self.teamID, "--url", simulator.baseURL,
            ]) == 0)
        #expect(try refresh(first.refresh).status == 400, "the refresh token is dead")
        let revoked = try revoke(first.refresh)
        #expect(revoked.status == 200 && revoked.body.isEmpty, "Apple answers 200 for a dead token too")
        #expect(simulator.revocations.last?.outcome == "dead_token")
        // Nothing was revoked: the authorization stays, and the next sign-in is no first one.
        #expect(!simulator.consentRevoked(teamID: Self.teamID, sub: first.sub, clientID: Self.clientID))
        #expect(simulator.isTokenValid(first.access), "the revoke ended nothing, not even the access token")
        let second = try exchange(sub: first.sub)
        #expect(try refresh(second.refresh).status == 200, "a later refresh shows the authorization alive")
        // A live token's revoke does end the authorization, and the later refresh shows that too.
        #expect(try revoke(second.refresh).status == 200)
        #expect(simulator.revocations.last?.outcome == "revoked")
        let after = try refresh(second.refresh)
        #expect(after.status == 400)
        #expect(try JSONValue.parseObject(after.body)["error"]?.stringValue == "invalid_grant")
        #expect(simulator.consentRevoked(teamID: Self.teamID, sub: first.sub, clientID: Self.clientID))
    }

    @Test(
        "an app transfer moves its client ids: the sender can neither refresh nor revoke their old tokens, its other apps go on")
    func appTransferMovesClientIDs() throws {
        let moved = try exchange()
        let stays = try exchange(sub: moved.sub, clientID: "com.example.web")
        #expect(
            AppleSimulatorCommand.run([
                "transfer-app", "--client-ids", Self.clientID, "--from", Self.teamID, "--to", "NEWTEAM001", "--url",
                simulator.baseURL,
            ]) == 0)
        for answer in [try refresh(moved.refresh), try revoke(moved.refresh)] {
            #expect(answer.status == 400)
            #expect(try JSONValue.parseObject(answer.body)["error"]?.stringValue == "invalid_client")
        }
        #expect(simulator.isTokenValid(moved.refresh), "the sender could not revoke it")
        #expect(try refresh(stays.refresh, clientID: "com.example.web").status == 200, "the sender's other app goes on")
        // The recipient's key now signs for the app; its revoke of the old team's token ends nothing.
        let recipientKey = try AsymmetricKey.generateP256()
        simulator.registerTeam(
            teamID: "NEWTEAM001", keyID: "NEWKEY0001",
            publicKey: try AppleSimulator.publicKey(fromPEM: recipientKey.privateKeyPEM()), clientIDs: [])
        let now = Int(Date().timeIntervalSince1970)
        let claims: [String: JSONValue] = [
            "iss": .string("NEWTEAM001"), "sub": .string(Self.clientID), "aud": .string("https://appleid.apple.com"),
            "iat": .integer(Int64(now)), "exp": .integer(Int64(now + 300)),
        ]
        let recipientSecret = try JWSSigner(key: recipientKey, keyID: "NEWKEY0001").sign(claims: claims)
        let recipientRevoke = try post(
            "/auth/revoke",
            form: [("client_id", Self.clientID), ("client_secret", recipientSecret), ("token", moved.refresh)])
        #expect(recipientRevoke.status == 200)
        #expect(simulator.revocations.last?.outcome == "other_team")
        #expect(simulator.isTokenValid(moved.refresh))
        // The JSON API does the same; a request naming no client id is refused.
        let refused = try client.send(
            .init(
                method: "POST", url: simulator.baseURL + "/sim/teams/transfer-app",
                headers: [("Content-Type", "application/json")],
                body: Array(#"{"client_ids":[],"from_team":"A","to_team":"B"}"#.utf8)))
        #expect(refused.status == 400)
    }
}
