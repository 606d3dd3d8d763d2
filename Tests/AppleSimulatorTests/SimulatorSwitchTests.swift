import BrokerCrypto
import Foundation
import HTTPClient
import HTTPServer
import JOSE
import Locking
import Observability
import StrictJSON
import Synchronization
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
                "--notification-url", "http://127.0.0.1:9/hook", "--notification-delay-ms", "1500",
                "--notification-timeout-ms", "250", "--notification-retries", "2", "--notification-retry-ms", "40",
                "--notification-duplicates", "1", "--request-error-rate", "0.25", "--request-error-seed", "42",
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
        expected.notificationURL = "http://127.0.0.1:9/hook"
        expected.notificationDelayMilliseconds = 1500
        expected.notificationTimeoutMilliseconds = 250
        expected.notificationRetries = 2
        expected.notificationRetryMilliseconds = 40
        expected.notificationDuplicates = 1
        expected.requestErrorRate = 0.25
        expected.requestErrorSeed = 42
        #expect(simulator.faults == expected)
        // A value that is not what the option takes is a usage error, not a silent default.
        #expect(AppleSimulatorCommand.run(["faults", "--retry-after", "soon", "--url", simulator.baseURL]) == 2)
        #expect(simulator.faults == expected)
        #expect(AppleSimulatorCommand.run(["faults", "--url", simulator.baseURL]) == 0)
        #expect(simulator.faults == FaultSettings(), "what is not given is Apple's default")
    }

    // MARK: Apple's clock (issue 35)

    @Test("a user's revocation sends consent-revoked, late and duplicated with a new jti, event_time the revocation's")
    func revocationNotifies() throws {
        let endpoint = try NotificationEndpoint()
        defer { endpoint.server.shutdown() }
        simulator.setAppGroups([[Self.clientID, "com.example.web"]])
        var mint = TokenRequest(clientID: "com.example.web")
        mint.teamID = Self.teamID
        mint.withCode = true
        let minted = try simulator.mintToken(mint)
        let exchanged = try post(
            "/auth/token",
            form: [
                ("client_id", "com.example.web"), ("client_secret", try clientSecret(clientID: "com.example.web")),
                ("code", minted.code!), ("grant_type", "authorization_code"),
            ])
        #expect(exchanged.status == 200)
        // Without an endpoint nothing is sent.
        #expect(simulator.revokeConsent(teamID: Self.teamID, sub: "001234.nobody.1234", clientID: Self.clientID) == 0)
        var faults = FaultSettings()
        faults.notificationURL = endpoint.url
        faults.notificationDelayMilliseconds = 300
        faults.notificationDuplicates = 1
        faults.notificationRetryMilliseconds = 100
        simulator.faults = faults
        let revokedAt = Date()
        // From the command line, as an operator would.
        #expect(
            AppleSimulatorCommand.run([
                "revoke-consent", "--sub", minted.sub, "--team", Self.teamID, "--url", simulator.baseURL,
            ]) == 0)
        let posts = try endpoint.wait(for: 2, keys: try keys())
        #expect(posts.count == 2)
        guard posts.count == 2 else { return }
        #expect(posts[0].at.timeIntervalSince(revokedAt) >= 0.3, "late: after notification_delay_ms")
        #expect(posts[0].jti != posts[1].jti, "a duplicate has a jti of its own")
        for post in posts {
            #expect(post.events["type"] == "consent-revoked")
            #expect(post.events["sub"]?.stringValue == minted.sub)
            let eventTime = Double(post.events["event_time"]?.integerValue ?? 0) / 1000
            #expect(abs(eventTime - revokedAt.timeIntervalSince1970) < 2, "the revocation's time, not the delivery's")
        }
        #expect(posts[0].events["event_time"] == posts[1].events["event_time"])
        // The simulator records a delivery once the receiver's answer reaches it, after the receiver saw the post.
        let deadline = Date().addingTimeInterval(10)
        while simulator.notificationDeliveries.count < 2 && Date() < deadline { Thread.sleep(forTimeInterval: 0.01) }
        let deliveries = simulator.notificationDeliveries
        #expect(deliveries.map(\.copy) == [0, 1])
        #expect(deliveries.allSatisfy { $0.status == 200 && $0.attempt == 1 })
        #expect(try client.send(.init(url: simulator.baseURL + "/sim/notifications/deliveries")).status == 200)
    }

    @Test("a delivery not answered within notification_timeout_ms is retried with the same jti")
    func notificationRetriedAfterTimeout() throws {
        let endpoint = try NotificationEndpoint(delays: [400])
        defer { endpoint.server.shutdown() }
        var faults = FaultSettings()
        faults.notificationURL = endpoint.url
        faults.notificationTimeoutMilliseconds = 100
        faults.notificationRetries = 2
        faults.notificationRetryMilliseconds = 50
        simulator.faults = faults
        simulator.deliver(
            NotificationRequest(url: endpoint.url, type: "consent-revoked", sub: "001234.abc.1234", clientID: Self.clientID))
        let posts = try endpoint.wait(for: 2, keys: try keys())
        #expect(posts.count == 2)
        #expect(Set(posts.map(\.jti)).count == 1, "a retry, not a duplicate")
        let deadline = Date().addingTimeInterval(5)
        while simulator.notificationDeliveries.count < 2 && Date() < deadline { Thread.sleep(forTimeInterval: 0.01) }
        #expect(simulator.notificationDeliveries.map(\.status) == [0, 200], "the first answer came too late")
        #expect(simulator.notificationDeliveries.map(\.attempt) == [1, 2])
    }

    @Test("request_error_rate: a seeded share of calls is an unworded invalid_request, whatever the token")
    func intermittentRequestErrors() throws {
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
        let refreshToken = try #require(try JSONValue.parseObject(exchanged.body)["refresh_token"]?.stringValue)
        func outcomes() throws -> [Int] {
            try (0..<40).map { _ in
                let answer = try post(
                    "/auth/token",
                    form: [
                        ("client_id", Self.clientID), ("client_secret", try clientSecret()), ("refresh_token", refreshToken),
                        ("grant_type", "refresh_token"),
                    ])
                if answer.status == 400 {
                    let body = try JSONValue.parseObject(answer.body)
                    #expect(body["error"] == "invalid_request")
                    #expect(body["error_description"]?.stringValue?.contains("revoked") == false, "no revocation's words")
                }
                return answer.status
            }
        }
        var faults = FaultSettings()
        faults.requestErrorRate = 0.5
        faults.requestErrorSeed = 7
        simulator.faults = faults
        let first = try outcomes()
        let failed = first.filter { $0 == 400 }.count
        #expect(failed >= 10 && failed <= 30, "\(failed) of 40 failed at a share of 0.5")
        #expect(Set(first) == [200, 400], "the same token both passes and fails")
        simulator.faults = faults
        #expect(try outcomes() == first, "the same seed fails the same calls")
        faults.requestErrorSeed = 8
        simulator.faults = faults
        #expect(try outcomes() != first)
    }
}

/// A notification endpoint on loopback: every body it gets, when, and how long it takes to answer.
final class NotificationEndpoint: Sendable {
    /// Every body with its arrival, in a box the route shares.
    final class Received: Sendable {
        let list = Lock<[(at: Date, body: [UInt8])]>([])
    }
    let received = Received()
    /// Milliseconds the n-th request (0-based) waits before its 200.
    let delays: [Int]
    let server: HTTPServer

    init(delays: [Int] = []) throws {
        self.delays = delays
        var router = Router()
        let received = received
        router.post("/hook") { request in
            let index = received.list.withLock { list in
                list.append((Date(), request.body))
                return list.count - 1
            }
            if index < delays.count { Thread.sleep(forTimeInterval: Double(delays[index]) / 1000) }
            return HTTPResponse(status: 200)
        }
        var configuration = HTTPServer.Configuration()
        configuration.listen = "127.0.0.1:0"
        configuration.accessLog = false
        server = HTTPServer(
            configuration: configuration, router: router, logger: Logger(label: "hook", sink: .capturing()),
            metrics: MetricsRegistry())
        try server.start()
    }

    var url: String { "http://127.0.0.1:\(server.port)/hook" }

    /// Waits until `count` bodies arrived (at most 10 s); their `jti` and events.
    func wait(for count: Int, keys: JWKSet) throws -> [(at: Date, jti: String, events: [String: JSONValue])] {
        let deadline = Date().addingTimeInterval(10)
        while received.list.withLock({ $0.count }) < count && Date() < deadline { Thread.sleep(forTimeInterval: 0.01) }
        return try received.list.withLock { $0 }.map { item in
            let payload = try #require(try JSONValue.parseObject(item.body)["payload"]?.stringValue)
            let claims = try JWSVerifier().verify(payload, keys: keys).claims()
            let events = try JSONValue.parseObject(Array(try #require(claims["events"]?.stringValue).utf8))
            return (item.at, try #require(claims["jti"]?.stringValue), events)
        }
    }
}
