import AppleID
import Foundation
import PostgresClient
import StrictJSON
import Workers

/// Moving users to another Apple team (protocol reference §6, P14). A user's `sub` is
/// team-scoped, so it changes when the app moves:
///
/// - **export** (sending team's credentials): for each identity of this team, Apple's
///   `/auth/usermigrationinfo` gives a `transfer_sub` for the recipient team; it is kept on
///   the identity (a login carrying it during the 60-day window then joins this user) and
///   written as a `{"user_id","transfer_sub"}` line. Neither the old `sub` nor an e-mail
///   leaves the database. The file is the progress record: a rerun skips its users.
/// - **import** (recipient team's credentials): each `transfer_sub` is exchanged for the
///   new `sub` and relay e-mail, which become a new identity of the same user; the old
///   identity is marked transferred and its refresh tokens retired. Users already linked (by an earlier run, or by a
///   login during the window) are skipped, so a rerun resumes.
///
/// Calls are paced to `rate` per second and blocking: run it on a thread of its own.
package struct TeamTransfer: Sendable {
    package let pool: PostgresPool
    package let apple: AppleClient
    /// This side's team.
    package let teamID: String
    /// The client id the transferred app signs in with (client secret `sub`).
    package let clientID: String
    /// Calls to Apple per second; 0 for no limit.
    package let rate: Double
    /// True once the run should stop after the current user (SIGINT/SIGTERM); it then
    /// reports what it did.
    package let shouldStop: @Sendable () -> Bool

    package init(
        pool: PostgresPool, apple: AppleClient, teamID: String, clientID: String, rate: Double,
        shouldStop: @escaping @Sendable () -> Bool = { false }
    ) {
        self.pool = pool
        self.apple = apple
        self.teamID = teamID
        self.clientID = clientID
        self.rate = rate
        self.shouldStop = shouldStop
    }

    /// What a run did.
    package struct Report: Sendable {
        package var total = 0
        /// Exported or linked by this run.
        package var done = 0
        /// Already done by an earlier run (or a login, for import).
        package var skipped = 0
        package var failed: [(userID: String, reason: String)] = []
        package var interrupted = false

        package init() {}

        package var failureReasons: [(reason: String, count: Int)] {
            Dictionary(grouping: failed, by: \.reason).map { ($0.key, $0.value.count) }.sorted { $0.count > $1.count }
        }
    }

    /// One line of the transfer file.
    package struct Line: Sendable, Equatable {
        package var userID: UUID
        package var transferSub: String

        package var json: String {
            String(
                decoding: JSONValue.object(["user_id": .string(userID.lowercasedString), "transfer_sub": .string(transferSub)]).serialized(),
                as: UTF8.self)
        }

        package init(userID: UUID, transferSub: String) {
            self.userID = userID
            self.transferSub = transferSub
        }

        package init?(json text: Substring) {
            guard let object = try? JSONValue.parseObject(Array(text.utf8)), let id = object["user_id"]?.stringValue,
                let userID = UUID(canonicalText: id), let transferSub = object["transfer_sub"]?.stringValue, !transferSub.isEmpty,
                transferSub.utf8.count <= 512
            else { return nil }
            self.init(userID: userID, transferSub: transferSub)
        }
    }

    package struct TransferError: Error, CustomStringConvertible {
        package let description: String

        package init(description: String) { self.description = description }
    }

    // MARK: Export

    /// Exports every identity of this team not yet in `path` (appending to it).
    package func export(recipientTeam: String, to path: String, progress: (Report) -> Void) throws -> Report {
        guard recipientTeam.count == 10, recipientTeam.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber) }) else {
            throw TransferError(description: "--recipient-team must be a 10-character Team ID")
        }
        guard recipientTeam != teamID else { throw TransferError(description: "the recipient team is this team (\(teamID))") }
        let (lines, goodLength) = try Self.read(path, tolerateTornTail: true)
        let done = Set(lines.map(\.userID))
        let file = try Self.openForAppend(path, truncatingTo: goodLength)
        defer { try? file.close() }

        var report = Report()
        report.total = try pool.query(
            """
            SELECT count(*) AS identities FROM apple_identities i JOIN users u ON u.id = i.user_id
            WHERE i.team_id = \(teamID) AND i.transferred_at IS NULL AND u.status = 'active'
            """
        ).single().decode(Int.self, "identities")
        var token = MigrationToken(apple: apple, clientID: clientID)
        var pacer = Pacer(rate: rate)
        let zero = UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
        var after = (user: zero, identity: zero)
        var unsynced = 0
        pages: while true {
            // Keyset pages in (user, identity) order, so a long export never holds one huge
            // result and a user's second identity is not lost at a page boundary.
            let page = try pool.query(
                """
                SELECT i.id, i.user_id, i.sub FROM apple_identities i JOIN users u ON u.id = i.user_id
                WHERE i.team_id = \(teamID) AND i.transferred_at IS NULL AND u.status = 'active'
                  AND (i.user_id, i.id) > (\(after.user), \(after.identity))
                ORDER BY i.user_id, i.id LIMIT 500
                """)
            guard !page.isEmpty else { break }
            for row in page {
                let identityID = try row.decode(UUID.self, "id")
                let userID = try row.decode(UUID.self, "user_id")
                after = (userID, identityID)
                if done.contains(userID) {
                    report.skipped += 1
                    continue
                }
                if shouldStop() {
                    report.interrupted = true
                    break pages
                }
                pacer.wait()
                guard
                    let answer = try ask(
                        [("sub", try row.decode(String.self, "sub")), ("target", recipientTeam)], token: &token,
                        for: userID, report: &report)
                else { continue }
                guard let transferSub = answer["transfer_sub"]?.stringValue, !transferSub.isEmpty else {
                    report.failed.append((userID.lowercasedString, "Apple's answer had no transfer_sub"))
                    continue
                }
                try pool.query("UPDATE apple_identities SET transfer_sub = \(transferSub) WHERE id = \(identityID)")
                try file.write(contentsOf: Array((Line(userID: userID, transferSub: transferSub).json + "\n").utf8))
                unsynced += 1
                if unsynced >= 100 {
                    try file.synchronize()
                    unsynced = 0
                }
                report.done += 1
                progress(report)
            }
        }
        try file.synchronize()
        return report
    }

    // MARK: Import

    /// Links every line of `path` not yet linked to its user under this team.
    package func importFile(_ path: String, progress: (Report) -> Void) throws -> Report {
        let (lines, _) = try Self.read(path, tolerateTornTail: false)
        var report = Report()
        report.total = lines.count
        var token = MigrationToken(apple: apple, clientID: clientID)
        var pacer = Pacer(rate: rate)
        for line in lines {
            if shouldStop() {
                report.interrupted = true
                break
            }
            let user = line.userID.lowercasedString
            if let owner = try pool.query(
                "SELECT user_id FROM apple_identities WHERE team_id = \(teamID) AND transfer_sub = \(line.transferSub) LIMIT 1"
            ).first.map({ try $0.decode(UUID.self, "user_id") }) {
                if owner == line.userID {
                    report.skipped += 1
                } else {
                    report.failed.append((user, "the transfer_sub is already linked to another user"))
                }
                continue
            }
            pacer.wait()
            guard let answer = try ask([("transfer_sub", line.transferSub)], token: &token, for: line.userID, report: &report)
            else { continue }
            guard let sub = answer["sub"]?.stringValue, !sub.isEmpty else {
                report.failed.append((user, "Apple's answer had no sub"))
                continue
            }
            if let reason = try link(line, sub: sub, email: answer["email"]?.stringValue,
                                     isPrivateEmail: answer["is_private_email"]?.lenientBoolValue ?? false) {
                report.failed.append((user, reason))
            } else {
                report.done += 1
            }
            progress(report)
        }
        return report
    }

    /// Creates the new identity for the user (one transaction); a reason when it cannot.
    private func link(_ line: Line, sub: String, email: String?, isPrivateEmail: Bool) throws -> String? {
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
            if try connection.query("SELECT status FROM users WHERE id = \(line.userID)").single().decode(String.self, "status") != "active" {
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

    // MARK: Helpers

    /// Apple's `/auth/usermigrationinfo` answer for one user, or nil with the reason recorded.
    /// Apple unreachable after the retries stops the run (a rerun resumes where it stopped).
    private func ask(
        _ fields: [(String, String)], token: inout MigrationToken, for userID: UUID, report: inout Report
    ) throws -> [String: JSONValue]? {
        do {
            return try token.call { accessToken in try apple.migrationInfo(fields, accessToken: accessToken, clientID: clientID) }
        } catch let error as AppleAPIError {
            if case .unavailable = error { throw error }
            report.failed.append((userID.lowercasedString, Self.reason(error)))
            return nil
        }
    }

    /// The lines of a transfer file (none if it does not exist) and the length of its
    /// well-formed part. A torn last line (a crash mid-write) is dropped when tolerated.
    /// Retires what the old team left of a transferred user: its identity is marked transferred
    /// and its refresh tokens revoked here, since this team's credentials can neither refresh
    /// nor revoke them (TN3159), so the sweep and deletions leave them alone. Used by
    /// `transfer import` and by a login carrying `transfer_sub`.
    package static func retireOldTeam(_ database: some PostgresQuerying, userID: UUID, teamID: String, transferSub: String) throws {
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

    package static func read(_ path: String, tolerateTornTail: Bool) throws -> ([Line], Int) {
        guard FileManager.default.fileExists(atPath: path) else {
            if tolerateTornTail { return ([], 0) }
            throw TransferError(description: "\(path) does not exist")
        }
        guard let data = FileManager.default.contents(atPath: path) else { throw TransferError(description: "cannot read \(path)") }
        let text = String(decoding: data, as: UTF8.self)
        var lines: [Line] = []
        var goodLength = 0
        var offset = 0
        let rows = text.split(separator: "\n", omittingEmptySubsequences: false)
        for (number, row) in rows.enumerated() {
            let isLast = number == rows.count - 1
            defer { offset += row.utf8.count + 1 }
            if row.isEmpty { continue }
            guard let line = Line(json: row), !isLast else {
                if isLast && tolerateTornTail { break }
                throw TransferError(description: "\(path):\(number + 1): not a {\"user_id\",\"transfer_sub\"} line")
            }
            lines.append(line)
            goodLength = offset + row.utf8.count + 1
        }
        return (lines, goodLength)
    }

    package static func openForAppend(_ path: String, truncatingTo length: Int) throws -> FileHandle {
        if !FileManager.default.fileExists(atPath: path) {
            guard FileManager.default.createFile(atPath: path, contents: nil, attributes: [.posixPermissions: 0o600]) else {
                throw TransferError(description: "cannot create \(path)")
            }
        }
        let file = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        try file.truncate(atOffset: UInt64(length))
        try file.seekToEnd()
        return file
    }

    package static func reason(_ error: AppleAPIError) -> String {
        switch error {
        case .invalidGrant: "Apple answered invalid_grant"
        case .invalidClient: "Apple refused the client credentials (invalid_client)"
        case .rejected(let status, let code, _): "Apple refused it (\(status) \(code ?? "no error code"))"
        case .unavailable(let reason, _): "Apple unavailable: \(reason)"
        case .malformedResponse(let reason): "Apple's answer was unreadable: \(reason)"
        }
    }
}

/// The `user.migration` access token, fetched when first needed and again before its hour
/// runs out or when Apple refuses it.
struct MigrationToken {
    let apple: AppleClient
    let clientID: String
    private var token: (value: String, fetched: ContinuousClock.Instant)?

    init(apple: AppleClient, clientID: String) {
        self.apple = apple
        self.clientID = clientID
    }

    mutating func call<T>(_ body: (String) throws -> T) throws -> T {
        if token == nil || ContinuousClock.now - token!.fetched > .seconds(3000) {
            token = (try apple.migrationAccessToken(clientID: clientID), .now)
        }
        do {
            return try body(token!.value)
        } catch AppleAPIError.invalidClient {
            token = (try apple.migrationAccessToken(clientID: clientID), .now)
            return try body(token!.value)
        }
    }
}

/// Spaces calls `1/rate` seconds apart (no limit for rate 0).
struct Pacer {
    let interval: Duration
    private var next = ContinuousClock.now

    init(rate: Double) { interval = rate > 0 ? .nanoseconds(Int64(1e9 / rate)) : .zero }

    mutating func wait() {
        guard interval > .zero else { return }
        let now = ContinuousClock.now
        if next > now { Thread.sleep(forTimeInterval: (next - now).seconds) }
        next = max(next, now) + interval
    }
}
