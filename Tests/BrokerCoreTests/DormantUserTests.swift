import BrokerAPI
import BrokerCore
import Foundation
import HTTPClient
import PostgresClient
import TestSupport
import Testing

/// Issue 35, item 13: what a missed `account-delete` leaves (every token dead, no sign-in
/// since) is not kept forever.
@Suite("Dormant users", .offPool)
struct DormantUserTests {
    /// A user of the app as the broker would hold them, written directly: `lastLogin` days ago,
    /// one token per entry of `tokens` (died so many days ago with that reason, or live: nil),
    /// and, when given, the app group's consent revoked so many days ago (its tokens gone).
    @discardableResult
    func seed(
        _ broker: TestBroker, lastLogin: Int, tokens: [(died: Int, reason: String?)?] = [], consentRevoked: Int? = nil
    ) throws -> UUID {
        let user = UUID()
        let identity = UUID()
        try broker.pool.query("INSERT INTO users (id) VALUES (\(user))")
        try broker.pool.query(
            """
            INSERT INTO apple_identities (id, user_id, team_id, sub, client_id, email, email_verified, is_private_email,
                                          last_login_at)
            VALUES (\(identity), \(user), \(TestBroker.teamID), \("001234." + UUID().uuidString + ".0042"), \(TestBroker.clientID),
                    'x@privaterelay.appleid.com', true, true, now() - \(String(lastLogin) + " days")::interval)
            """)
        for (index, token) in tokens.enumerated() {
            // One row per (identity, client id): each further token is another client id's.
            let clientID = index == 0 ? TestBroker.clientID : TestBroker.webClientID
            try broker.pool.query(
                """
                INSERT INTO apple_tokens (id, identity_id, user_id, client_id, refresh_token, key_id, revoked_at, revoked_reason)
                VALUES (\(UUID()), \(identity), \(user), \(clientID), '\\x00'::bytea, 'k',
                        now() - \(token.map { String($0.died) + " days" })::interval, \(token?.reason))
                """)
        }
        if let consentRevoked {
            try broker.pool.query(
                """
                INSERT INTO apple_grants (identity_id, user_id, app_id, consent, consent_at)
                VALUES (\(identity), \(user), \(TestBroker.clientID), 'revoked', now() - \(String(consentRevoked) + " days")::interval)
                """)
        }
        return user
    }

    @Test(
        "a user whose every token has been dead past the retention, with no sign-in since, is deleted; recent deaths, later sign-ins, live tokens and transfers are kept"
    )
    func dormantUsersAreDeleted() throws {
        let seeded = try TestBroker()
        let deadToken = try seed(seeded, lastLogin: 401, tokens: [(400, "token_invalid")])
        let revokedConsent = try seed(seeded, lastLogin: 401, consentRevoked: 400)
        let kept = [
            try seed(seeded, lastLogin: 10, tokens: [(400, "token_invalid")]),  // signed in since
            try seed(seeded, lastLogin: 401, tokens: [(30, "token_invalid")]),  // died recently
            try seed(seeded, lastLogin: 401, tokens: [(400, "token_invalid"), nil]),  // another token lives
            try seed(seeded, lastLogin: 401, tokens: [(400, "team_transfer")]),  // moved with its app
            try seed(seeded, lastLogin: 401, tokens: [(400, nil)]),  // retired by a transfer import
        ]
        // The default is a year; 0 keeps dormant users.
        #expect(
            try BrokerConfiguration.load(environment: seeded.environment, requireApple: true).deletion.dormantUserRetention
                == .seconds(365 * 86_400))
        var keep = seeded.environment
        keep["BROKER_DORMANT_USER_RETENTION_SECONDS"] = "0"
        #expect(try BrokerConfiguration.load(environment: keep, requireApple: true).deletion.dormantUserRetention == nil)

        // A broker running housekeeping (its first round at start) and the deletion job.
        let broker = try TestBroker(
            database: try PostgresConfiguration(connectionString: seeded.environment["DATABASE_URL"]!),
            roles: [.sweep, .deletion],
            extra: [
                "BROKER_DORMANT_USER_RETENTION_SECONDS": String(365 * 86_400),
                "TOKEN_ENCRYPTION_KEY": seeded.environment["TOKEN_ENCRYPTION_KEY"]!,
                "BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1",
            ])
        try waitUntil(seconds: 30) {
            try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 2
        }
        for user in [deadToken, revokedConsent] {
            #expect(try broker.count("SELECT count(*) FROM users WHERE id = \(user)") == 0, "dormant user \(user) deleted")
        }
        for user in kept {
            #expect(try broker.count("SELECT count(*) FROM users WHERE id = \(user)") == 1, "user \(user) kept")
        }
        #expect(
            try broker.count(
                "SELECT count(*) FROM deletion_requests WHERE source = 'cli' AND requested_by = 'retention' AND reason LIKE 'retention:%'"
            ) == 2)
        // Nobody to ask: the dead token's group needs no follow-up, the revoked one had nothing to end.
        let groups = try broker.pool.query(
            "SELECT revocation || ' ' || coalesce(follow_up_closed_by, '-') AS g FROM deletion_app_groups ORDER BY 1"
        ).map { try $0.decode(String.self, "g") }
        #expect(groups == ["already_invalid -", "manual_required retention"])
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'user.deleted'") == 2)
    }
}
