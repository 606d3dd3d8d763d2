import AppleSimulator
import BrokerAPI
import Foundation
import HTTPClient
import PostgresClient
import ProcessRunner
import TestSupport
import Testing

@testable import BrokerCore

/// Issue 35, item 12: a team transfer is dated by the transfer (TN3159), on both sides.
@Suite("Team transfer, dated by the transfer", .offPool)
struct TeamTransferWindowTests {
    static let recipientTeam = "NEWTEAM001"

    func write(_ lines: [TeamTransfer.Line]) throws -> String {
        let path = TestFiles.path("transfer", suffix: ".jsonl")
        try lines.map { $0.json + "\n" }.joined().write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    func staged(_ broker: TestBroker) throws -> Int { try broker.count("SELECT count(*) FROM transfer_staged") }

    @Test("staged lines live until a day after the 60 days that follow the transfer, not the staging")
    func stagedLinesFollowTheTransfer() throws {
        let broker = try TestBroker()
        // The sender made a transfer_sub for one of its users before initiating the transfer
        // (TN3159); the recipient staged the file at once, long before the transfer completed.
        let user = broker.simulator.createUser(teamID: TestBroker.teamID)
        let transferSub = try broker.simulator.transferSub(teamID: TestBroker.teamID, sub: user.sub, to: Self.recipientTeam)
        let file = try write([
            TeamTransfer.Line(userID: UUID(), transferSub: transferSub),
            TeamTransfer.Line(userID: UUID(), transferSub: "000unknown.t"),
        ])
        let keyPath = try TestEnvironment.privateKeyFile()
        broker.simulator.registerTeam(
            teamID: Self.recipientTeam, keyID: "NEWKEY0001",
            publicKey: try AppleSimulator.publicKey(fromPEM: try String(contentsOfFile: keyPath, encoding: .utf8)),
            clientIDs: [TestBroker.clientID, TestBroker.webClientID])
        var recipient = broker.environment
        recipient["APPLE_TEAM_ID"] = Self.recipientTeam
        recipient["APPLE_KEY_ID"] = "NEWKEY0001"
        recipient["APPLE_PRIVATE_KEY_PATH"] = keyPath
        recipient["BROKER_LOG_LEVEL"] = "error"
        let stage = try BrokerExecutable.run(["transfer", "import", "--in", file, "--stage-only"], environment: recipient)
        #expect(stage.status == 0 && stage.stdout.contains("staged: 2"), "\(stage.stderr)")
        try broker.pool.query("UPDATE transfer_staged SET staged_at = now() - interval '70 days'")
        // The transfer completes; the import's first answer from Apple dates it.
        let imported = try BrokerExecutable.run(["transfer", "import", "--in", file, "--rate", "0"], environment: recipient)
        #expect(imported.stdout.contains("migrated: 1"), "\(imported.stdout) \(imported.stderr)")
        #expect(
            try broker.count(
                "SELECT count(*) FROM transfer_staged WHERE transferred_at > now() - interval '1 minute'") == 2)
        try TeamTransferStore.pruneStaged(broker.pool)
        #expect(try staged(broker) == 2, "70 days after staging, but the transfer is new: the lines stay")
        try broker.pool.query("UPDATE transfer_staged SET transferred_at = now() - interval '60 days'")
        try TeamTransferStore.pruneStaged(broker.pool)
        #expect(try staged(broker) == 2, "inside the window and its day")
        try broker.pool.query("UPDATE transfer_staged SET transferred_at = now() - interval '62 days'")
        try TeamTransferStore.pruneStaged(broker.pool)
        #expect(try staged(broker) == 0, "a day after the window they go")

        // A file staged with no transfer date yet lives as long as a transfer initiated then can
        // take (60 days to accept, two business days) plus the window; --transferred-at dates it.
        let later = try write([TeamTransfer.Line(userID: UUID(), transferSub: "000later.t")])
        #expect(
            try BrokerExecutable.run(["transfer", "import", "--in", later, "--stage-only"], environment: recipient).status == 0)
        try broker.pool.query("UPDATE transfer_staged SET staged_at = now() - interval '100 days'")
        try TeamTransferStore.pruneStaged(broker.pool)
        #expect(try staged(broker) == 1)
        let dated = try BrokerExecutable.run(
            [
                "transfer", "import", "--in", later, "--stage-only", "--transferred-at",
                ISO8601DateFormatter().string(from: Date().addingTimeInterval(-10 * 86_400)),
            ], environment: recipient)
        #expect(dated.status == 0, "\(dated.stderr)")
        try broker.pool.query("UPDATE transfer_staged SET staged_at = now() - interval '130 days'")
        try TeamTransferStore.pruneStaged(broker.pool)
        #expect(try staged(broker) == 1, "dated ten days ago: it stays, however old the staging")
        try broker.pool.query("UPDATE transfer_staged SET transferred_at = NULL")
        try TeamTransferStore.pruneStaged(broker.pool)
        #expect(try staged(broker) == 0, "undated and staged 130 days ago: gone")
    }

    @Test(
        "a sender that keeps the broker retires the moved app's tokens: their invalid_client never pauses its other apps, deletions skip them"
    )
    func senderStopsValidatingTheMovedApp() throws {
        let broker = try TestBroker(
            roles: [.api, .sweep, .deletion],
            extra: [
                "APPLE_APP_GROUPS": "\(TestBroker.clientID);\(TestBroker.webClientID)",
                "BROKER_SWEEP_INTERVAL_SECONDS": "1", "BROKER_SWEEP_CONCURRENCY": "1",
                "BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1",
            ])
        // Three users of the app that moves, one of the app the sender keeps.
        let movers = try (0..<3).map { _ in try broker.signIn(clients: [TestBroker.clientID]) }
        let stayer = try broker.signIn(clients: [TestBroker.webClientID])
        // The transfer completes at Apple: the app's client id is the recipient's now.
        broker.simulator.transferApp(clientIDs: [TestBroker.clientID], from: TestBroker.teamID, to: Self.recipientTeam)
        let completed = try BrokerExecutable.run(
            ["transfer", "complete", "--recipient-team", Self.recipientTeam, "--client-id", TestBroker.clientID],
            environment: broker.environment)
        #expect(completed.status == 0, "\(completed.stderr)")
        #expect(completed.stdout.contains("tokens retired: 3"), "\(completed.stdout)")

        // Every token due, the moved app's first: before, three invalid_client in a row opened the
        // sweep's breaker and the kept app's token waited behind it.
        try broker.pool.query(
            """
            UPDATE apple_tokens SET next_validation_at = now() - CASE WHEN client_id = \(TestBroker.clientID)
                THEN interval '1 hour' ELSE interval '1 minute' END
            """)
        try waitUntil(seconds: 15) {
            try broker.count("SELECT count(*) FROM apple_tokens WHERE user_id = \(stayer.id) AND last_validated_at IS NOT NULL")
                == 1
        }
        #expect(
            try broker.count("SELECT count(*) FROM apple_tokens WHERE user_id = \(stayer.id) AND last_validated_at IS NOT NULL")
                == 1, "the kept app's token was validated")
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE last_validation_error IS NOT NULL") == 0)
        #expect(try broker.get("/metrics").bodyText.contains("refresh_sweep_breaker_open 0"))
        #expect(
            try broker.count(
                "SELECT count(*) FROM apple_tokens WHERE revoked_reason = 'team_transfer' AND client_id = \(TestBroker.clientID)")
                == 3)

        // Deleting a user of the moved app: its group is not this team's to revoke any more.
        let answer = try broker.post(
            "/v1/deletions", json: #"{"user_id":"\#(movers[0].id.lowercasedString)","reason":"r","requested_by":"q"}"#,
            key: broker.key([.compliance]))
        let id = try #require(answer.json["deletion_id"] as? String)
        try waitUntil(seconds: 20) { try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 1 }
        let record = try broker.get("/v1/deletions/\(id)", key: broker.key([.compliance])).json
        let groups = (record["app_groups"] as? [[String: Any]] ?? []).map {
            "\($0["app_id"] as? String ?? "") \($0["apple_revocation"] as? String ?? "")"
        }
        #expect(groups == ["\(TestBroker.clientID) transferred"], "\(record)")
        #expect(broker.simulator.revocations.isEmpty, "nothing sent to Apple that Apple would refuse")
    }
}
