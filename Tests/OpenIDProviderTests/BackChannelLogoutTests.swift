import AppleSimulator
import Foundation
import HTTPClient
import JOSE
import PostgresClient
import StrictJSON
import TestSupport
import Testing

/// Apple's events reach relying parties: consent-revoked and account-delete end the user's
/// grants at once and send a Back-Channel Logout token; email-disabled shows in userinfo.
@Suite("OpenID Provider back-channel logout", .offPool)
struct BackChannelLogoutTests {
    static func harness() throws -> ProviderHarness {
        try ProviderHarness(
            extra: ["BROKER_DISPATCH_INTERVAL_MS": "20", "BROKER_WEBHOOK_RETRY_BASE_MS": "50"],
            roles: "api,notifications,dispatch")
    }

    func notify(_ harness: ProviderHarness, _ type: String, sub: String, laterBy seconds: Int64 = 0) throws {
        var request = NotificationRequest(
            url: harness.baseURL + "/v1/apple/notifications", type: type, sub: sub, clientID: "com.example.app")
        // Apple's events carry their time; the later one wins (a same-millisecond pair would not).
        request.eventTimeMilliseconds = Int64(Date().timeIntervalSince1970 * 1000) + seconds * 1000
        let result = try harness.simulator.sendNotification(request)
        #expect(result.status == 200)
    }

    func userinfo(_ harness: ProviderHarness, _ access: String) throws -> HTTPClientResponse {
        try harness.send("GET", "/oidc/userinfo", headers: [("Authorization", "Bearer \(access)")])
    }

    @Test("consent-revoked ends the grants at once and a verifiable logout token reaches every RP holding one")
    func consentRevoked() throws {
        let harness = try Self.harness()
        let receiver = try LogoutReceiver()
        let withSessions = try harness.confidentialClient(
            extra: ["backchannel_logout_uri": receiver.url, "backchannel_logout_session_required": true])
        let withoutLogout = try harness.confidentialClient(redirectURI: "https://other.example.com/cb")
        let first = try harness.signInWithCode(withSessions)
        let second = try harness.signInWithCode(withoutLogout, sub: first.sub)
        #expect(second.userID == first.userID, "sub is the broker's user_id, the same at every RP")

        try notify(harness, "consent-revoked", sub: first.sub)
        // At once: the notification's transaction ended them.
        #expect(try userinfo(harness, first.access).status == 401)
        #expect(try userinfo(harness, second.access).status == 401)
        let refreshed = try harness.token([("grant_type", "refresh_token"), ("refresh_token", first.refresh)], as: withSessions)
        #expect(refreshed.json["error"] as? String == "invalid_grant")

        let tokens = receiver.wait(for: 1)
        #expect(tokens.count == 1, "one RP has a back-channel logout URI")
        let token = try #require(tokens.first)
        let header = try JWSVerifier(allowedAlgorithms: [.rs256]).unverifiedHeader(token)
        #expect(header.type == "logout+jwt")
        let claims = try harness.verifiedClaims(token)
        #expect(claims["iss"]?.stringValue == ProviderHarness.issuer)
        #expect(claims["aud"]?.stringValue == withSessions.id)
        #expect(claims["sub"]?.stringValue == first.userID)
        #expect(claims["sid"]?.stringValue == first.sid)
        #expect(claims["jti"]?.stringValue?.isEmpty == false)
        #expect(claims["iat"]?.integerValue != nil && claims["exp"]?.integerValue != nil)
        #expect(claims["nonce"] == nil, "Back-Channel Logout 1.0 §2.4: never a nonce")
        #expect(
            claims["events"]?.objectValue?["http://schemas.openid.net/event/backchannel-logout"]?.objectValue != nil)
        // Visible like webhook deliveries.
        let listed = try harness.send(
            "GET", "/v1/oidc-logout-deliveries?state=delivered", headers: [("Authorization", "Bearer \(try harness.adminKey())")])
        #expect(listed.status == 200)
        #expect((listed.json["deliveries"] as? [[String: Any]])?.first?["reason"] as? String == "consent.revoked")
    }

    @Test("a new logout delivery wakes its lane at once (NOTIFY from the trigger), not at the next poll")
    func wokenAtOnce() throws {
        // The lanes look for work once a minute on their own: only a wake-up delivers within seconds.
        let harness = try ProviderHarness(
            extra: ["BROKER_DISPATCH_INTERVAL_MS": "60000"], roles: "api,notifications,dispatch")
        let receiver = try LogoutReceiver()
        let client = try harness.confidentialClient(extra: ["backchannel_logout_uri": receiver.url])
        let signedIn = try harness.signInWithCode(client)
        let sent = Date()
        try notify(harness, "consent-revoked", sub: signedIn.sub)
        #expect(receiver.wait(for: 1, seconds: 20).count == 1)
        #expect(Date().timeIntervalSince(sent) < 20, "woken, not polled")
    }

    @Test("account-delete ends the grants; a receiver that fails is retried until it answers")
    func accountDelete() throws {
        let harness = try Self.harness()
        let receiver = try LogoutReceiver()
        receiver.answer(503)
        let client = try harness.confidentialClient(extra: ["backchannel_logout_uri": receiver.url])
        let signedIn = try harness.signInWithCode(client)
        try notify(harness, "account-delete", sub: signedIn.sub)
        #expect(try userinfo(harness, signedIn.access).status == 401)
        Thread.sleep(forTimeInterval: 0.3)
        #expect(try harness.count("SELECT count(*) FROM oidc_logout_deliveries WHERE attempts > 0 AND state = 'pending'") == 1)
        receiver.answer(200)
        let tokens = receiver.wait(for: 1)
        #expect(tokens.count == 1)
        let claims = try harness.verifiedClaims(try #require(tokens.first))
        #expect(claims["sub"]?.stringValue == signedIn.userID)
        #expect(claims["sid"] == nil, "the RP did not ask for sessions")
    }

    @Test("a delivery past the maximum age is failed (a dead letter) and the admin API re-drives it")
    func deadLetterRedriven() throws {
        let harness = try ProviderHarness(
            extra: [
                "BROKER_DISPATCH_INTERVAL_MS": "20", "BROKER_WEBHOOK_RETRY_BASE_MS": "50", "BROKER_WEBHOOK_MAX_AGE_SECONDS": "1",
            ],
            roles: "api,notifications,dispatch")
        let receiver = try LogoutReceiver()
        receiver.answer(500)
        let client = try harness.confidentialClient(extra: ["backchannel_logout_uri": receiver.url])
        let signedIn = try harness.signInWithCode(client)
        try notify(harness, "consent-revoked", sub: signedIn.sub)
        let deadline = Date().addingTimeInterval(15)
        while try harness.count("SELECT count(*) FROM oidc_logout_deliveries WHERE state = 'failed'") == 0 && Date() < deadline {
            Thread.sleep(forTimeInterval: 0.05)
        }
        let key = try harness.adminKey()
        for limit in ["null", "0", "1001", "1.5"] {
            let refused = try harness.send(
                "GET", "/v1/oidc-logout-deliveries?limit=\(limit)", headers: [("Authorization", "Bearer \(key)")])
            #expect(refused.status == 400, "limit=\(limit)")
        }
        let failed = try harness.send(
            "GET", "/v1/oidc-logout-deliveries?state=failed&limit=5", headers: [("Authorization", "Bearer \(key)")])
        let delivery = try #require((failed.json["deliveries"] as? [[String: Any]])?.first, "\(failed.bodyText)")
        #expect(delivery["last_status"] as? Int == 500)
        #expect(receiver.received.isEmpty)
        receiver.answer(200)
        let id = try #require(delivery["id"] as? Int)
        let retried = try harness.send(
            "POST", "/v1/oidc-logout-deliveries/\(id)/retry", headers: [("Authorization", "Bearer \(key)")])
        #expect(retried.status == 204)
        #expect(receiver.wait(for: 1).count == 1)
        #expect(
            try harness.send("POST", "/v1/oidc-logout-deliveries/\(id)/retry", headers: [("Authorization", "Bearer \(key)")])
                .status == 404, "only a failed delivery is re-driven")
        // Both re-drives are audited with their target and outcome (issue 38, item 5).
        let audited = try harness.pool.query(
            "SELECT concat_ws(' ', target, outcome) FROM audit_log WHERE action = 'oidc_logout_delivery.retried' ORDER BY id"
        ).map { try $0.decode(String.self, 0) }
        #expect(audited == ["oidc_logout_delivery:\(id) succeeded", "oidc_logout_delivery:\(id) failed"])
    }

    @Test("email-disabled and email-enabled show in userinfo at once")
    func emailForwarding() throws {
        let harness = try Self.harness()
        let client = try harness.confidentialClient()
        let signedIn = try harness.signInWithCode(client)
        #expect(try userinfo(harness, signedIn.access).json["email_forwarding"] as? String == "enabled")
        try notify(harness, "email-disabled", sub: signedIn.sub)
        #expect(try userinfo(harness, signedIn.access).json["email_forwarding"] as? String == "disabled")
        try notify(harness, "email-enabled", sub: signedIn.sub, laterBy: 5)
        #expect(try userinfo(harness, signedIn.access).json["email_forwarding"] as? String == "enabled")
    }
}
