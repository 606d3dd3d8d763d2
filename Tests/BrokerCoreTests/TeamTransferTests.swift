import AppleSimulator
import BrokerAPI
import BrokerCrypto
import Foundation
import PostgresClient
import ProcessRunner
import TestSupport
import Testing

@testable import BrokerCore

/// `appleid-broker transfer export|import` between two teams the simulator plays, run as
/// the operator runs them (child processes), each killed halfway and resumed.
@Suite("Team transfer", .offPool)
struct TeamTransferTests {
    static let recipientTeam = "NEWTEAM001"
    static let recipientKeyID = "NEWKEY0001"

    /// Creates `count` users of the sending team, known to the simulator and to the broker.
    func seedUsers(_ broker: TestBroker, count: Int) throws -> [String] {
        let subs = (0..<count).map { _ in broker.simulator.createUser(teamID: TestBroker.teamID).sub }
        // Subs are digits, hex and dots: safe inside an array literal.
        let array = "{" + subs.joined(separator: ",") + "}"
        try broker.pool.query(
            """
            WITH s AS (SELECT sub, gen_random_uuid() AS uid FROM unnest(\(array)::text[]) AS sub),
                 u AS (INSERT INTO users (id) SELECT uid FROM s)
            INSERT INTO apple_identities (id, user_id, team_id, sub, client_id, email, email_verified, is_private_email, given_name)
            SELECT gen_random_uuid(), uid, \(TestBroker.teamID), sub, \(TestBroker.clientID), 'old@privaterelay.appleid.com',
                   true, true, 'Old'
            FROM s
            """)
        return subs
    }

    /// Runs a transfer command in the background and sends it `signal` once `progress`
    /// reaches `at`; returns its exit status and output.
    @discardableResult
    func runAndInterrupt(
        _ arguments: [String], environment: [String: String], signal: Int32, at: Int, progress: () throws -> Int
    ) throws -> (status: Int32, output: String) {
        let log = TestFiles.path("transfer", suffix: ".log")
        let child = try ChildProcess.start(BrokerExecutable.path, arguments, environment: environment, output: .file(log))
        try waitUntil(seconds: 60) { try progress() >= at || !child.isRunning }
        child.send(signal)
        let status = child.wait()
        let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        let reached = try progress()
        #expect(reached >= at && reached < 1000, "interrupted halfway, at \(reached): \(output)")
        return (status, output)
    }

    @Test("1,000 users move to another team: export and import each interrupted halfway, then resumed")
    func thousandUsers() throws {
        let broker = try TestBroker()
        let count = 1000
        _ = try seedUsers(broker, count: count)
        // Five of them hold a refresh token of the old team.
        try broker.pool.query(
            """
            INSERT INTO apple_tokens (id, identity_id, user_id, client_id, refresh_token, key_id)
            SELECT gen_random_uuid(), id, user_id, client_id, '\\x00'::bytea, 'k' FROM apple_identities LIMIT 5
            """)
        let file = TestFiles.path("transfer", suffix: ".jsonl")
        var sender = broker.environment
        sender["BROKER_LOG_LEVEL"] = "error"
        func fileLines() -> [String] {
            ((try? String(contentsOfFile: file, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        }

        // Sending side, paced so it can be killed halfway.
        let export = ["transfer", "export", "--recipient-team", Self.recipientTeam, "--out", file]
        // A crash: SIGKILL, possibly mid-line.
        try runAndInterrupt(export + ["--rate", "200"], environment: sender, signal: SIGKILL, at: 300) { fileLines().count }
        let before = fileLines().count
        let callsBefore = broker.simulator.statistics.migration
        let resumed = try ChildProcess.run(BrokerExecutable.path, export + ["--rate", "0"], environment: sender)
        #expect(resumed.status == 0, "\(resumed.output)")
        #expect(resumed.output.contains("exported: \(count - before)"), "\(resumed.output)")
        #expect(resumed.output.contains("already done before: \(before)"), "\(resumed.output)")
        let lines = fileLines()
        #expect(lines.count == count)
        let parsed = lines.compactMap { TeamTransfer.Line(json: Substring($0)) }
        #expect(Set(parsed.map(\.userID)).count == count, "one line per user, none twice")
        #expect(
            broker.simulator.statistics.migration - callsBefore == count - before, "the resumed run asked Apple only for the rest"
        )
        #expect(!lines.joined().contains("privaterelay"), "no e-mail and no old sub leaves in the file")
        #expect(try broker.count("SELECT count(*) FROM apple_identities WHERE transfer_sub IS NOT NULL") == count)

        // Receiving side: the recipient team's credentials, the same database.
        let keyPath = try TestEnvironment.privateKeyFile()
        broker.simulator.registerTeam(
            teamID: Self.recipientTeam, keyID: Self.recipientKeyID,
            publicKey: try AppleSimulator.publicKey(fromPEM: try String(contentsOfFile: keyPath, encoding: .utf8)),
            clientIDs: [TestBroker.clientID, TestBroker.webClientID])
        var recipient = sender
        recipient["APPLE_TEAM_ID"] = Self.recipientTeam
        recipient["APPLE_KEY_ID"] = Self.recipientKeyID
        recipient["APPLE_PRIVATE_KEY_PATH"] = keyPath
        let linked = { try broker.count("SELECT count(*) FROM apple_identities WHERE team_id = \(Self.recipientTeam)") }
        let importing = ["transfer", "import", "--in", file]
        // Ctrl-C: the current user is finished, the report printed, exit 130.
        let stopped = try runAndInterrupt(
            importing + ["--rate", "200"], environment: recipient, signal: SIGINT, at: 300, progress: linked)
        #expect(stopped.status == 130, "\(stopped.output)")
        #expect(stopped.output.contains("interrupted: run the same command again"), "\(stopped.output)")
        let linkedBefore = try linked()
        let finished = try ChildProcess.run(BrokerExecutable.path, importing + ["--rate", "0"], environment: recipient)
        #expect(finished.status == 0, "\(finished.output)")
        #expect(finished.output.contains("migrated: \(count - linkedBefore)"), "\(finished.output)")
        #expect(finished.output.contains("already done before: \(linkedBefore)"), "\(finished.output)")
        #expect(finished.output.contains("failed: 0"))

        // Every user has its new identity, under the same user id, with its name; the old
        // identity is marked transferred; nobody was duplicated.
        #expect(try linked() == count)
        #expect(try broker.count("SELECT count(*) FROM users") == count)
        #expect(
            try broker.count(
                """
                SELECT count(*) FROM apple_identities n JOIN apple_identities o
                  ON o.transfer_sub = n.transfer_sub AND o.team_id = \(TestBroker.teamID) AND o.user_id = n.user_id
                WHERE n.team_id = \(Self.recipientTeam) AND n.given_name = 'Old' AND o.transferred_at IS NOT NULL
                  AND n.email LIKE '%@privaterelay.appleid.com' AND n.sub <> o.sub
                """) == count)
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'identity.linked'") == count)
        // The old team's tokens are retired: the sweep and deletions skip them.
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE revoked_at IS NOT NULL") == 5)
        let someUser = try #require(parsed.first).userID
        #expect(
            try broker.get("/v1/users/\(someUser.lowercasedString)/credential-state", key: broker.key([.read])).json["state"]
                as? String == "authorized")

        // A line Apple does not know is reported with the reason, and the exit status says so.
        let bogus = TestFiles.path("transfer-bogus", suffix: ".jsonl")
        try (TeamTransfer.Line(userID: UUID(), transferSub: "000unknown.t").json + "\n").write(
            toFile: bogus, atomically: true, encoding: .utf8)
        let failed = try ChildProcess.run(BrokerExecutable.path, ["transfer", "import", "--in", bogus], environment: recipient)
        #expect(failed.status == 1)
        #expect(failed.output.contains("failed: 1"), "\(failed.output)")
        #expect(failed.output.contains("invalid_request"), "\(failed.output)")
    }
}
