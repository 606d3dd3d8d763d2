import AppleIDBrokerClient
import AppleSimulator
import BrokerAPI
import BrokerCore
import BrokerCrypto
import Foundation
import PostgresClient
import StrictJSON
import TestSupport
import Testing

/// `AppleIDBrokerClient`, the library Swift app backends use, against a live broker.
@Suite("Swift client library", .offPool)
struct ClientLibraryTests {
    @Test(
        "login, user, credential state, the feed, deletions and problems, typed; webhook deliveries verify, tampered ones do not")
    func endToEnd() async throws {
        let broker = try TestBroker(
            roles: [.api, .deletion, .dispatch],
            extra: [
                "BROKER_DISPATCH_INTERVAL_MS": "50", "BROKER_DELETION_RETRY_BASE_MS": "50",
                "BROKER_DELETION_INTERVAL_SECONDS": "1",
            ])
        let key = try broker.key([.login, .read, .compliance, .events, .admin])
        let client = AppleIDBrokerClient(baseURL: URL(string: broker.baseURL)!, apiKey: key)
        let receiver = try WebhookReceiver()
        let subscription = try broker.post(
            "/v1/webhook-subscriptions", json: #"{"url":"\#(receiver.url)","topics":["*"]}"#, key: key)
        let secret = try #require(subscription.json["secret"] as? String)
        receiver.setSecret(secret)

        // The app's nonce: raw on the device, its lowercase hex SHA-256 in the Apple request.
        let rawNonce = Base64URL.encode(SecureRandom.bytes(32))
        let minted = try broker.mint {
            $0.withCode = true
            $0.rawNonce = rawNonce
        }
        let login = try await client.login(
            .init(
                identityToken: minted.idToken, authorizationCode: minted.code, rawNonce: rawNonce,
                user: .init(name: .init(firstName: "Grace", lastName: "Hopper"))))
        #expect(login.isNewUser)
        #expect(login.refreshTokenStored)
        #expect(login.appleSub == minted.sub)
        do {
            _ = try await client.login(.init(identityToken: minted.idToken, rawNonce: "another"))
            Issue.record("a wrong nonce was accepted")
        } catch let problem as BrokerProblem {
            #expect(problem.status == 401)
            #expect(problem.code == "nonce_mismatch")
        }

        let user = try await client.user(login.userID)
        #expect(user.identities.first?.givenName == "Grace")
        #expect(user.identities.first?.orgID == nil)
        // A Managed Apple Account's org_id reaches the client library's model.
        let managed = try await client.login(.init(identityToken: try broker.mint { $0.managedAccount = true }.idToken))
        #expect(try await client.user(managed.userID).identities.first?.orgID?.hasPrefix("org.") == true)
        #expect(try await client.credentialState(userID: login.userID, clientID: TestBroker.clientID) == .authorized)
        do {
            _ = try await client.user(UUID().uuidString)
            Issue.record("an unknown user was found")
        } catch let problem as BrokerProblem {
            #expect(problem.status == 404 && problem.code == "user_not_found")
        }

        // The feed holds back events until every older transaction in the cluster has ended (its
        // horizon is cluster-wide, and other suites write beside this one), so wait for both users'
        // events before checking that the cursor then reaches the end.
        var page = try await client.events()
        for _ in 0..<300 where page.events.filter({ $0.type == "user.created" }).count < 2 {
            try await Task.sleep(for: .milliseconds(100))
            page = try await client.events()
        }
        #expect(page.events.filter { $0.type == "user.created" }.count == 2)
        #expect(try await client.events(after: page.nextCursor).events.isEmpty)

        // A real delivery verifies with the library; a changed body or an old one does not.
        waitUntil { !receiver.deliveries.isEmpty }
        let delivery = try #require(receiver.deliveries.first)
        let verifier = try #require(WebhookVerifier(secret: secret))
        let verified = try verifier.verify(
            body: delivery.body, header: { delivery.headers[$0.lowercased()] }, now: delivery.receivedAt)
        #expect(verified.type == "user.created")
        #expect(verified.data["user_id"]?.stringValue == login.userID)
        #expect(page.events.map(\.id).contains(verified.eventID), "the delivery names the feed's event")
        var tampered = delivery.body
        tampered[tampered.count - 2] ^= 1
        #expect(throws: WebhookVerifier.Failure.badSignature) {
            try verifier.verify(body: tampered, header: { delivery.headers[$0.lowercased()] }, now: delivery.receivedAt)
        }
        #expect(throws: WebhookVerifier.Failure.staleTimestamp) {
            try verifier.verify(
                body: delivery.body, header: { delivery.headers[$0.lowercased()] },
                now: delivery.receivedAt.addingTimeInterval(3600))
        }

        let accepted = try await client.requestDeletion(
            .init(userID: login.userID, reason: "asked in the app", requestedBy: "test"))
        #expect(accepted.created)
        try waitUntil(seconds: 30) { try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 1 }
        let deletion = try await client.deletion(accepted.deletionID)
        #expect(deletion.state == "done")
        #expect(deletion.appleRevocation == "revoked")
        #expect(try await client.credentialState(userID: login.userID) == .deleted)
    }
}
