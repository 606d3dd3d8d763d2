import BrokerCore
import Foundation
import PostgresClient
import TestSupport
import Testing

/// `UserDirectory.profile`, what the OpenID Provider's claims come from (the provider reads no
/// BrokerCore table itself).
@Suite("User directory", .offPool)
struct UserDirectoryTests {
    @Test("the profile is the identity signed in last, not a transferred one, with its app group's mail forwarding")
    func profile() throws {
        let fixture = try StoreFixture()
        let directory = UserDirectory(pool: fixture.pool, groups: .separate(["com.example.app"]))
        let first = try fixture.user(email: "old@example.com", givenName: "Old", lastLogin: Date().addingTimeInterval(-3600))
        let second = try fixture.user(
            email: "new@privaterelay.appleid.com", givenName: "New", lastLogin: Date(), userID: first.user)
        try fixture.user(
            email: "gone@example.com", lastLogin: Date().addingTimeInterval(60), transferred: true, userID: first.user)
        try fixture.pool.query(
            """
            INSERT INTO apple_grants (identity_id, user_id, app_id, email_forwarding)
            VALUES (\(second.identity), \(first.user), 'com.example.app', 'disabled')
            """)
        let profile = try #require(try directory.profile(of: first.user, appID: "com.example.app"))
        #expect(profile.email == "new@privaterelay.appleid.com" && profile.givenName == "New" && profile.emailVerified)
        #expect(profile.emailForwarding == "disabled")
        #expect(try directory.profile(of: first.user, appID: "com.example.other")?.emailForwarding == "enabled")
        #expect(try directory.profile(of: UUID(), appID: "com.example.app") == nil)
    }
}
