import Foundation
import PostgresClient

/// The database side of a team transfer (`TeamTransfer` keeps the decisions and the file):
/// the identities to export, page by page, their `transfer_sub`, and the import's link.
struct TeamTransferStore: Sendable {
    let pool: PostgresPool
    let teamID: String

    /// Active users' identities of this team not yet transferred.
    func exportableCount() throws -> Int {
        try pool.query(
            """
            SELECT count(*) AS identities FROM apple_identities i JOIN users u ON u.id = i.user_id
            WHERE i.team_id = \(teamID) AND i.transferred_at IS NULL AND u.status = 'active'
            """
        ).single().decode(Int.self, "identities")
    }

    struct Identity: Sendable {
        var id: UUID
        var userID: UUID
        var sub: String
    }

    /// The next 500 of them after `after` in (user, identity) order (a keyset page).
    func exportPage(after: (user: UUID, identity: UUID)) throws -> [Identity] {
        try pool.query(
            """
            SELECT i.id, i.user_id, i.sub FROM apple_identities i JOIN users u ON u.id = i.user_id
            WHERE i.team_id = \(teamID) AND i.transferred_at IS NULL AND u.status = 'active'
              AND (i.user_id, i.id) > (\(after.user), \(after.identity))
            ORDER BY i.user_id, i.id LIMIT 500
            """
        ).map { row in
            Identity(
                id: try row.decode(UUID.self, "id"), userID: try row.decode(UUID.self, "user_id"),
                sub: try row.decode(String.self, "sub"))
        }
    }

    /// Keeps the `transfer_sub` Apple gave for an exported identity.
    func setTransferSub(_ transferSub: String, identity identityID: UUID) throws {
        try pool.query("UPDATE apple_identities SET transfer_sub = \(transferSub) WHERE id = \(identityID)")
    }

    /// Writes down each line's transfer_sub → user id for logins that come before the import
    /// reaches them (`LoginStore`), 500 a statement, with when the transfer completed when the
    /// operator says so (a date given replaces one recorded before).
    func stage(_ lines: [TeamTransfer.Line], transferredAt: Date? = nil) throws {
        for start in stride(from: 0, to: lines.count, by: 500) {
            let page = lines[start..<min(start + 500, lines.count)]
            try pool.query(
                """
                INSERT INTO transfer_staged (team_id, transfer_sub, user_id, transferred_at)
                SELECT \(teamID), s, u::uuid, \(transferredAt) FROM unnest(\(PostgresTextArray(page.map(\.transferSub)))::text[],
                    \(PostgresTextArray(page.map(\.userID.lowercasedString)))::text[]) AS l(s, u)
                ON CONFLICT (team_id, transfer_sub) DO UPDATE SET transferred_at = EXCLUDED.transferred_at
                    WHERE EXCLUDED.transferred_at IS NOT NULL
                """)
        }
    }

    /// The transfer of these lines has completed by now (Apple answered the recipient for one of
    /// them): their window runs from now unless a date was recorded already.
    func markTransferred(_ lines: [TeamTransfer.Line]) throws {
        for start in stride(from: 0, to: lines.count, by: 500) {
            let page = lines[start..<min(start + 500, lines.count)]
            try pool.query(
                """
                UPDATE transfer_staged SET transferred_at = now()
                WHERE team_id = \(teamID) AND transfer_sub = ANY (\(PostgresTextArray(page.map(\.transferSub)))::text[])
                  AND transferred_at IS NULL
                """)
        }
    }

    /// The staged user id of a transfer_sub this team's import has not linked yet.
    static func stagedUser(_ database: some PostgresQuerying, teamID: String, transferSub: String) throws -> UUID? {
        try database.query(
            "SELECT user_id FROM transfer_staged WHERE team_id = \(teamID) AND transfer_sub = \(transferSub)"
        ).first.map { try $0.decode(UUID.self, "user_id") }
    }

    /// Staged lines outlive Apple's 60-day window by a day, then go. The window starts with the
    /// transfer, not with the staging, which TN3159 has come before it (transfer identifiers are
    /// made before the transfer is initiated): counted from `transferred_at` when known (the
    /// import's first answer from Apple, or `--transferred-at`), else from the latest the
    /// transfer can complete for a file staged once the transfer was initiated: the recipient
    /// has 60 days to accept it and Apple up to two business days to carry it out (App Store
    /// Connect Help, "Accept an app transfer"), so 64 days after staging.
    static func pruneStaged(_ pool: PostgresPool) throws {
        try pool.query(
            """
            DELETE FROM transfer_staged
            WHERE coalesce(transferred_at, staged_at + interval '64 days') < now() - interval '61 days'
            """)
    }

    /// The sending side, once the transfer completed: records which of this team's client ids
    /// moved to `recipientTeam`, and retires this team's refresh tokens for them, which its
    /// credentials can neither refresh nor revoke now (TN3159; protocol reference §10.8), so the
    /// sweep stops validating them (their `invalid_client` would pause every other app) and
    /// deletions decide their group as `transferred`. One transaction; returns the tokens retired.
    func complete(clientIDs: [String], recipientTeam: String, transferredAt: Date) throws -> Int {
        try pool.withTransaction { connection in
            try connection.query(
                """
                INSERT INTO transferred_apps (team_id, client_id, recipient_team, transferred_at)
                SELECT \(teamID), c, \(recipientTeam), \(transferredAt) FROM unnest(\(PostgresTextArray(clientIDs))::text[]) AS c
                ON CONFLICT (team_id, client_id) DO UPDATE SET recipient_team = EXCLUDED.recipient_team,
                    transferred_at = EXCLUDED.transferred_at
                """)
            return try connection.query(
                """
                UPDATE apple_tokens SET revoked_at = now(), revoked_reason = 'team_transfer'
                WHERE revoked_at IS NULL AND client_id = ANY (\(PostgresTextArray(clientIDs))::text[])
                  AND identity_id IN (SELECT id FROM apple_identities WHERE team_id = \(teamID))
                """
            ).affectedRows
        }
    }

    /// The user already linked under this team by `transferSub`, if any.
    func owner(ofTransferSub transferSub: String) throws -> UUID? {
        try pool.query(
            "SELECT user_id FROM apple_identities WHERE team_id = \(teamID) AND transfer_sub = \(transferSub) LIMIT 1"
        ).first.map({ try $0.decode(UUID.self, "user_id") })
    }

    /// Creates the new identity for the user under this team, issued to `clientID` (one
    /// transaction); a reason when it cannot.
    func link(_ line: TeamTransfer.Line, sub: String, clientID: String, email: String?, isPrivateEmail: Bool) throws -> String? {
        try pool.withTransaction { connection -> String? in
            if let owner = try connection.query(
                "SELECT user_id FROM apple_identities WHERE team_id = \(teamID) AND sub = \(sub)"
            ).first.map({ try $0.decode(UUID.self, "user_id") }) {
                guard owner == line.userID else { return "the new sub already belongs to another user" }
                try connection.query(
                    "UPDATE apple_identities SET transfer_sub = \(line.transferSub) WHERE team_id = \(teamID) AND sub = \(sub)")
                return nil
            }
            if try connection.query("SELECT 1 FROM tombstones WHERE user_id = \(line.userID)").first != nil {
                return "the user was deleted"
            }
            // The same database: the user exists. A recipient with a database of its own
            // gets the user under the sender's id, so the app's references stay valid.
            try connection.query("INSERT INTO users (id) VALUES (\(line.userID)) ON CONFLICT (id) DO NOTHING")
            if try connection.query("SELECT status FROM users WHERE id = \(line.userID)").single().decode(
                UserStatus.self, "status") != .active
            {
                return "the user's deletion is pending"
            }
            try connection.query(
                """
                INSERT INTO apple_identities (
                    id, user_id, team_id, sub, client_id, email, email_verified, is_private_email, transfer_sub,
                    given_name, family_name)
                SELECT gen_random_uuid(), \(line.userID), \(teamID), \(sub), \(clientID), \(email), \(email != nil),
                       \(isPrivateEmail), \(line.transferSub), old.given_name, old.family_name
                FROM (SELECT NULL) AS nothing
                LEFT JOIN LATERAL (
                    SELECT given_name, family_name FROM apple_identities
                    WHERE user_id = \(line.userID) AND team_id <> \(teamID) AND transfer_sub = \(line.transferSub) LIMIT 1
                ) AS old ON true
                """)
            try Self.retireOldTeam(connection, userID: line.userID, teamID: teamID, transferSub: line.transferSub)
            try connection.query(
                """
                SELECT broker_emit_event('identity.linked', \(line.userID),
                    jsonb_build_object('user_id', \(line.userID)::text, 'client_id', \(clientID)::text, 'reason', 'team_transfer'))
                """)
            return nil
        }
    }

    /// Retires what the old team left of a transferred user: its identity is marked transferred
    /// and its refresh tokens revoked here, since this team's credentials can neither refresh
    /// nor revoke them (TN3159), so the sweep and deletions leave them alone. Used by
    /// `transfer import` and by a login carrying `transfer_sub`.
    static func retireOldTeam(_ database: some PostgresQuerying, userID: UUID, teamID: String, transferSub: String) throws {
        try database.query(
            """
            UPDATE apple_tokens SET revoked_at = now()
            WHERE revoked_at IS NULL AND identity_id IN (
                SELECT id FROM apple_identities
                WHERE user_id = \(userID) AND team_id <> \(teamID) AND transfer_sub = \(transferSub))
            """)
        try database.query(
            """
            UPDATE apple_identities SET transferred_at = now()
            WHERE user_id = \(userID) AND team_id <> \(teamID) AND transfer_sub = \(transferSub)
              AND transferred_at IS NULL
            """)
    }
}
