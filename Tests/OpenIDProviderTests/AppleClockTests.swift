import AppleSimulator
import Foundation
import HTTPClient
import PostgresClient
import StrictJSON
import TestSupport
import Testing

/// Issue 35 at the provider: Apple's "sign in again" (`token.invalidated`) ends the grants
/// built on that authorization, and a consent-revoked older than a later sign-in logs no one
/// out (protocol reference §12.1, §12.4).
@Suite("OpenID Provider by Apple's clock", .offPool)
struct AppleClockTests {
    /// The app and the provider's Services ID share one authorization at Apple.
    static let grouped = ["APPLE_APP_GROUPS": "com.example.app=\(ProviderHarness.appleClientID)"]

    static func harness(roles: String, extra: [String: String] = [:]) throws -> ProviderHarness {
        let harness = try ProviderHarness(
            extra: ["BROKER_DISPATCH_INTERVAL_MS": "20", "BROKER_WEBHOOK_RETRY_BASE_MS": "50"].merging(grouped) { $1 }
                .merging(extra) { $1 },
            roles: roles)
        harness.simulator.setAppGroups([["com.example.app", ProviderHarness.appleClientID]])
        return harness
    }

    @Test("token.invalidated (a password change found by the sweep) ends the group's grants: refresh fails, logout sent")
    func tokenInvalidatedEndsGrants() throws {
        let harness = try Self.harness(
            roles: "api,notifications,dispatch,sweep",
            extra: ["BROKER_SWEEP_INTERVAL_SECONDS": "1", "BROKER_SWEEP_CONCURRENCY": "1"])
        let receiver = try LogoutReceiver()
        let client = try harness.confidentialClient(extra: ["backchannel_logout_uri": receiver.url])
        let signedIn = try harness.signInWithCode(client)
        // The user changes their password: Apple's refresh answers invalid_grant, "sign in again".
        #expect(harness.simulator.changePassword(teamID: ProviderHarness.teamID, sub: signedIn.sub) == 1)
        try harness.pool.query("UPDATE apple_tokens SET next_validation_at = now()")
        let tokens = receiver.wait(for: 1)
        #expect(tokens.count == 1)
        if let token = tokens.first {
            #expect(try harness.verifiedClaims(token)["sub"]?.stringValue == signedIn.userID)
        }
        let refreshed = try harness.token([("grant_type", "refresh_token"), ("refresh_token", signedIn.refresh)], as: client)
        #expect(refreshed.json["error"] as? String == "invalid_grant")
        #expect(
            try harness.send("GET", "/oidc/userinfo", headers: [("Authorization", "Bearer \(signedIn.access)")]).status == 401)
        #expect(try harness.count("SELECT count(*) FROM oidc_logout_deliveries WHERE reason = 'token.invalidated'") == 1)
    }

    @Test("a consent-revoked delivered after the user signed in again logs no one out and ends no grant")
    func staleRevocationLogsNoOneOut() throws {
        let harness = try Self.harness(roles: "api,notifications,dispatch")
        let receiver = try LogoutReceiver()
        let client = try harness.confidentialClient(extra: ["backchannel_logout_uri": receiver.url])
        let first = try harness.signInWithCode(client)
        var faults = FaultSettings()
        faults.notificationURL = harness.baseURL + "/v1/apple/notifications"
        faults.notificationDelayMilliseconds = 3000
        faults.notificationDuplicates = 1
        faults.notificationRetryMilliseconds = 200
        harness.simulator.faults = faults
        let revokedAt = Date()
        harness.simulator.revokeConsent(teamID: ProviderHarness.teamID, sub: first.sub, clientID: ProviderHarness.appleClientID)
        // The user signs in again (a second later: an `iat` has whole seconds); then Apple's
        // notification arrives, late, and once more with a new jti.
        while Int(Date().timeIntervalSince1970) <= Int(revokedAt.timeIntervalSince1970) { Thread.sleep(forTimeInterval: 0.01) }
        let second = try harness.signInWithCode(client, sub: first.sub)
        #expect(second.userID == first.userID)
        try waitUntil(seconds: 15) { try harness.count("SELECT count(*) FROM apple_notifications") == 2 }
        #expect(try harness.count("SELECT count(*) FROM apple_notifications WHERE outcome = 'stale'") == 2)
        #expect(try harness.count("SELECT count(*) FROM oidc_logout_deliveries") == 0, "no Back-Channel Logout")
        #expect(try harness.count("SELECT count(*) FROM oidc_grants WHERE ended_at IS NOT NULL") == 0)
        #expect(try harness.count("SELECT count(*) FROM outbox_events WHERE type = 'consent.revoked'") == 0)
        let refreshed = try harness.token([("grant_type", "refresh_token"), ("refresh_token", second.refresh)], as: client)
        #expect(refreshed.status == 200, "\(refreshed.bodyText)")
        #expect(
            try harness.count("SELECT count(*) FROM apple_tokens WHERE revoked_at IS NULL") == 1, "the newest Apple token stays")
        #expect(receiver.received.isEmpty)
    }
}
