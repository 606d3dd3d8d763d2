import BrokerCrypto
import Foundation
import HTTPClient
import StrictJSON
import Testing

@testable import AppleSimulator

/// The switches issue 28 asks of the simulator (each default is what Apple does), and the
/// `apple-sim faults` command line that reaches every one of them.
extension AppleSimulatorTests {
    /// The claims of an identity token (already known to be the simulator's).
    func claims(_ token: String) throws -> [String: JSONValue] {
        let payload = try #require(Base64URL.decode(String(token.split(separator: ".")[1])))
        return try JSONValue.parseObject(payload)
    }

    @Test("a transfer is bridged for 60 days: transfer_sub in the new sub's tokens and usermigrationinfo, then neither")
    func transferWindow() throws {
        let user = simulator.createUser(teamID: Self.teamID)
        let transferSub = try simulator.transferSub(teamID: Self.teamID, sub: user.sub, to: "NEWTEAM001")
        let recipient = try simulator.recipient(ofTransfer: transferSub, teamID: "NEWTEAM001")
        var request = TokenRequest(clientID: "com.example.app.new")
        request.teamID = "NEWTEAM001"
        request.sub = recipient.sub
        #expect(try claims(simulator.mintToken(request).idToken)["transfer_sub"]?.stringValue == transferSub)

        simulator.faults.transferAgeDays = 59
        #expect(try simulator.recipient(ofTransfer: transferSub, teamID: "NEWTEAM001") == recipient)
        simulator.faults.transferAgeDays = 61
        #expect(throws: (any Error).self) { try simulator.recipient(ofTransfer: transferSub, teamID: "NEWTEAM001") }
        #expect(throws: (any Error).self) { try simulator.transferSub(teamID: Self.teamID, sub: user.sub, to: "NEWTEAM001") }
        #expect(try claims(simulator.mintToken(request).idToken)["transfer_sub"] == nil)
    }

    @Test("the first web authorization after a revocation carries the user field again (switchable)")
    func userFieldAfterRevocation() throws {
        simulator.registerReturnURLs(clientID: Self.clientID, urls: ["https://example.com/cb"])
        var mint = TokenRequest(clientID: Self.clientID)
        mint.teamID = Self.teamID
        mint.withCode = true
        let minted = try simulator.mintToken(mint)
        let exchanged = try post(
            "/auth/token",
            form: [
                ("client_id", Self.clientID), ("client_secret", try clientSecret()), ("code", minted.code!),
                ("grant_type", "authorization_code"),
            ])
        #expect(exchanged.status == 200)
        // A password change (from the command line) kills the refresh token, not the authorization.
        let refreshToken = try #require(try JSONValue.parseObject(exchanged.body)["refresh_token"]?.stringValue)
        #expect(
            AppleSimulatorCommand.run(["change-password", "--sub", minted.sub, "--team", Self.teamID, "--url", simulator.baseURL])
                == 0)
        #expect(!simulator.isTokenValid(refreshToken))
        #expect(!simulator.consentRevoked(teamID: Self.teamID, sub: minted.sub, clientID: Self.clientID))
        func authorize() throws -> String {
            let query =
                "client_id=\(Self.clientID)&redirect_uri=https%3A%2F%2Fexample.com%2Fcb&response_type=code"
                + "&scope=name%20email&response_mode=form_post&sim_sub=\(minted.sub)"
            let page = try client.send(.init(url: simulator.baseURL + "/auth/authorize?" + query))
            #expect(page.status == 200)
            return String(decoding: page.body, as: UTF8.self)
        }
        #expect(!(try authorize()).contains(#"name="user""#), "authorized: no user field")
        let revoked = AppleSimulatorCommand.run([
            "revoke-consent", "--sub", minted.sub, "--client-id", Self.clientID, "--team", Self.teamID, "--url",
            simulator.baseURL,
        ])
        #expect(revoked == 0)
        #expect(try authorize().contains(#"name="user""#), "a first authorization again")
        simulator.faults.userFieldAfterRevocation = false
        #expect(!(try authorize()).contains(#"name="user""#))
    }

    @Test("managed accounts carry org_id and a real address; relay addresses come on either relay domain")
    func accountsAndDomains() throws {
        var request = TokenRequest(clientID: Self.clientID)
        request.teamID = Self.teamID
        request.managedAccount = true
        let managed = try claims(simulator.mintToken(request).idToken)
        #expect(managed["org_id"]?.stringValue?.isEmpty == false)
        #expect(managed["email"]?.stringValue?.hasSuffix("@org.example") == true)
        #expect(managed["is_private_email"] == nil)

        simulator.faults.relayDomain = "private.icloud.com"
        #expect(simulator.createUser(teamID: Self.teamID).email?.hasSuffix("@private.icloud.com") == true)
        simulator.faults = FaultSettings()
        #expect(simulator.createUser(teamID: Self.teamID).email?.hasSuffix("@privaterelay.appleid.com") == true)
    }

    @Test("apple-sim faults reaches every switch of FaultSettings")
    func faultsCommandLine() throws {
        let covered = Set(AppleSimulatorCommand.faultOptions.map(\.key.stringValue))
        #expect(covered == Set(FaultSettings.CodingKeys.allCases.map(\.stringValue)), "an option per switch")

        let status = AppleSimulatorCommand.run(
            [
                "faults", "--latency-ms", "5", "--error-rate", "0.5", "--error-statuses", "503,429", "--retry-after", "9",
                "--retry-after-http-date", "--timeout-rate", "0.1", "--timeout-ms", "200", "--timeout-before-work",
                "--invalid-grant", "--revoked-grant-error", "invalid_request", "--invalid-client", "--empty-key-set",
                "--endpoints", "token,revoke", "--malformed-request", "--malformed-request-subs", "a,b",
                "--transfer-age-days", "61", "--no-user-field-after-revocation", "--relay-domain", "private.icloud.com",
                "--url", simulator.baseURL,
            ])
        #expect(status == 0)
        var expected = FaultSettings()
        expected.latencyMilliseconds = 5
        expected.errorRate = 0.5
        expected.errorStatuses = [503, 429]
        expected.retryAfterSeconds = 9
        expected.retryAfterAsDate = true
        expected.timeoutRate = 0.1
        expected.timeoutMilliseconds = 200
        expected.timeoutAfterWork = false
        expected.forceInvalidGrant = true
        expected.revokedGrantError = "invalid_request"
        expected.forceInvalidClient = true
        expected.emptyKeySet = true
        expected.endpoints = ["token", "revoke"]
        expected.malformedRequest = true
        expected.malformedRequestSubs = ["a", "b"]
        expected.transferAgeDays = 61
        expected.userFieldAfterRevocation = false
        expected.relayDomain = "private.icloud.com"
        #expect(simulator.faults == expected)
        // A value that is not what the option takes is a usage error, not a silent default.
        #expect(AppleSimulatorCommand.run(["faults", "--retry-after", "soon", "--url", simulator.baseURL]) == 2)
        #expect(simulator.faults == expected)
        #expect(AppleSimulatorCommand.run(["faults", "--url", simulator.baseURL]) == 0)
        #expect(simulator.faults == FaultSettings(), "what is not given is Apple's default")
    }
}
