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
///   login during the window) are skipped, so a rerun resumes. The file's lines are staged
///   first (`transfer_staged`): a login with a `transfer_sub` the import has not reached yet
///   joins the sender's user id, even in a database of its own.
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

    /// The SQL of export and import.
    var store: TeamTransferStore { TeamTransferStore(pool: pool, teamID: teamID) }

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
                decoding: JSONValue.object(["user_id": .string(userID.lowercasedString), "transfer_sub": .string(transferSub)])
                    .serialized(),
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
        report.total = try store.exportableCount()
        var token = MigrationToken(apple: apple, clientID: clientID)
        var pacer = Pacer(rate: rate)
        let zero = UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
        var after = (user: zero, identity: zero)
        var unsynced = 0
        pages: while true {
            // Keyset pages in (user, identity) order, so a long export never holds one huge
            // result and a user's second identity is not lost at a page boundary.
            let page = try store.exportPage(after: after)
            guard !page.isEmpty else { break }
            for identity in page {
                let (identityID, userID) = (identity.id, identity.userID)
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
                        [("sub", identity.sub), ("target", recipientTeam)], token: &token,
                        for: userID, report: &report)
                else { continue }
                guard let transferSub = answer["transfer_sub"]?.stringValue, !transferSub.isEmpty else {
                    report.failed.append((userID.lowercasedString, "Apple's answer had no transfer_sub"))
                    continue
                }
                try store.setTransferSub(transferSub, identity: identityID)
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

    /// Writes down the lines of `path` (transfer_sub → user id) without calling Apple; returns
    /// how many. Run on the recipient as soon as the file arrives: from then on a login
    /// carrying one of them joins the sender's user id (protocol reference §11.6), also before
    /// the transfer completes and the import can ask Apple. The lines live until a day after
    /// the 60 days that follow the transfer (`transferredAt` when known; see `pruneStaged`).
    package func stageFile(_ path: String, transferredAt: Date? = nil) throws -> Int {
        let (lines, _) = try Self.read(path, tolerateTornTail: false)
        try store.stage(lines, transferredAt: transferredAt)
        return lines.count
    }

    /// Links every line of `path` not yet linked to its user under this team (staging them
    /// all first, as `stageFile`). Apple answering for one of them shows the transfer has
    /// completed: unless `transferredAt` says when, the lines' window runs from then.
    package func importFile(_ path: String, transferredAt: Date? = nil, progress: (Report) -> Void) throws -> Report {
        let (lines, _) = try Self.read(path, tolerateTornTail: false)
        // Every line first, before any call to Apple (paced, hours for a large team): a login
        // carrying one of these transfer_subs meanwhile joins the sender's user id, not a new user.
        try store.stage(lines, transferredAt: transferredAt)
        var transferDated = transferredAt != nil
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
            if let owner = try store.owner(ofTransferSub: line.transferSub) {
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
            if !transferDated {
                try store.markTransferred(lines)
                transferDated = true
            }
            if let reason = try store.link(
                line, sub: sub, clientID: clientID, email: answer["email"]?.stringValue,
                isPrivateEmail: answer["is_private_email"]?.lenientBoolValue ?? false)
            {
                report.failed.append((user, reason))
            } else {
                report.done += 1
            }
            progress(report)
        }
        return report
    }

    // MARK: Complete (sending side)

    /// The transfer completed: `clientIDs` (the transferred app group) now belong to
    /// `recipientTeam`. Retires this team's tokens for them, which it can neither refresh nor
    /// revoke any more (TN3159), so a sender that keeps the broker for its other apps stops
    /// validating them; returns how many were retired. Calls nothing at Apple.
    package func complete(clientIDs: [String], recipientTeam: String, transferredAt: Date) throws -> Int {
        guard recipientTeam.count == 10, recipientTeam.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber) }) else {
            throw TransferError(description: "--recipient-team must be a 10-character Team ID")
        }
        guard recipientTeam != teamID else { throw TransferError(description: "the recipient team is this team (\(teamID))") }
        return try store.complete(clientIDs: clientIDs, recipientTeam: recipientTeam, transferredAt: transferredAt)
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
    package static func read(_ path: String, tolerateTornTail: Bool) throws -> ([Line], Int) {
        guard FileManager.default.fileExists(atPath: path) else {
            if tolerateTornTail { return ([], 0) }
            throw TransferError(description: "\(path) does not exist")
        }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw TransferError(description: "cannot read \(path)")
        }
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
