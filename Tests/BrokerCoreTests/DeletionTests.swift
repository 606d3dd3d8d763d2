import AppleSimulator
import BrokerAPI
import BrokerCore
import BrokerCrypto
import Foundation
import HTTPClient
import PostgresClient
import ProcessRunner
import TestSupport
import Testing

/// Cascaded account deletion end to end: the compliance API, the deletion job revoking at
/// the simulator over HTTP, and the purge.
@Suite("Deletions", .offPool)
struct DeletionTests {
    static let fast = ["BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1"]

    private func user(_ broker: TestBroker, clients: [String] = [TestBroker.clientID]) throws -> (id: UUID, sub: String) {
        try broker.signIn(clients: clients)
    }

    private func requestDeletion(_ broker: TestBroker, _ body: [String: Any]) throws -> HTTPClientResponse {
        let data = try JSONSerialization.data(withJSONObject: body)
        return try broker.post("/v1/deletions", json: String(decoding: data, as: UTF8.self), key: broker.key([.compliance]))
    }

    /// Makes the simulator answer every revoke with 500, so deletions dead-letter.
    private func failEveryRevoke(_ broker: TestBroker) {
        var faults = FaultSettings()
        faults.errorRate = 1
        faults.errorStatuses = [500]
        faults.endpoints = ["revoke"]
        broker.simulator.faults = faults
    }

    /// Waits until every deletion request is done or failed (or the time is up).
    private func waitForDeletions(_ broker: TestBroker, seconds: Double = 30) throws {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if try broker.count("SELECT count(*) FROM deletion_requests WHERE state NOT IN ('done', 'failed')") == 0 { return }
            Thread.sleep(forTimeInterval: 0.05)
        }
    }

    @Test(
        "tokens for two client ids are revoked with the right client id each, then the user is purged without a trace of personal data"
    )
    func twoClients() throws {
        // Two apps that stand alone at Apple: each is an authorization of its own to end (§12.3).
        let broker = try TestBroker(
            roles: [.api, .deletion],
            extra: Self.fast.merging(["APPLE_APP_GROUPS": "\(TestBroker.clientID);\(TestBroker.webClientID)"]) { $1 })
        let (userID, sub) = try user(broker, clients: [TestBroker.clientID, TestBroker.webClientID])
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE user_id = \(userID)") == 2)
        let tokens = broker.simulator.revocations  // none yet
        #expect(tokens.isEmpty)
        let email = try broker.pool.query("SELECT email FROM apple_identities WHERE user_id = \(userID)").first!.decode(
            String.self, 0)
        // Slow revokes keep the request pending while the second request below arrives.
        var faults = FaultSettings()
        faults.latencyMilliseconds = 500
        faults.endpoints = ["revoke"]
        broker.simulator.faults = faults

        let response = try requestDeletion(
            broker, ["user_id": userID.lowercasedString, "reason": "user asked in the app", "requested_by": "support-42"])
        #expect(response.status == 202)
        let deletionID = try #require(response.json["deletion_id"] as? String)
        #expect(response.json["created"] as? Bool == true)
        // A second request while it is pending returns the same id.
        let again = try requestDeletion(broker, ["apple_sub": sub, "reason": "again", "requested_by": "support-43"])
        #expect(again.status == 202)
        #expect(again.json["deletion_id"] as? String == deletionID)
        #expect(again.json["created"] as? Bool == false)

        try waitForDeletions(broker)
        // Per client id (each its own app group) the refresh token, once a refresh showed it alive,
        // then the access token that refresh brought, which revoking the refresh token already
        // ended: revoking ends the grant (§10.3).
        let revocations = broker.simulator.revocations
        #expect(revocations.count == 4)
        #expect(Set(revocations.map(\.clientID)) == [TestBroker.clientID, TestBroker.webClientID])
        for clientID in [TestBroker.clientID, TestBroker.webClientID] {
            let calls = revocations.filter { $0.clientID == clientID && $0.sub == sub }.map {
                "\($0.tokenTypeHint ?? "") \($0.outcome)"
            }
            #expect(calls == ["refresh_token revoked", "access_token already_revoked"], "\(clientID): \(calls)")
        }

        let record = try broker.get("/v1/deletions/\(deletionID)", key: broker.key([.compliance]))
        #expect(record.json["state"] as? String == "done")
        let created = try #require(record.json["created_at"] as? String)
        #expect(created.count == 24 && created.hasSuffix("Z"), "RFC 3339 with milliseconds: \(created)")
        let steps = try #require(record.json["steps"] as? [[String: Any]])
        #expect(steps.filter { $0["step"] as? String == "revoke" && $0["outcome"] as? String == "revoked" }.count == 2)
        #expect(steps.filter { $0["step"] as? String == "check_token" && $0["outcome"] as? String == "alive" }.count == 2)
        #expect(record.json["apple_revocation"] as? String == "revoked")
        let groups = try #require(record.json["app_groups"] as? [[String: Any]])
        #expect(
            groups.map { "\($0["app_id"] ?? "") \($0["apple_revocation"] ?? "")" }.sorted()
                == ["\(TestBroker.clientID) revoked", "\(TestBroker.webClientID) revoked"])
        #expect(steps.contains { $0["step"] as? String == "purge" })

        for table in ["users", "apple_identities", "apple_tokens"] {
            #expect(try broker.count("SELECT count(*) FROM \(unescaped: table)") == 0, "\(table) purged")
        }
        // The tombstone names the sub by its keyed hash only.
        #expect(try broker.count("SELECT count(*) FROM tombstones WHERE sub_hash = \(broker.subjectHash(sub))") == 1)
        #expect(try broker.count("SELECT count(*) FROM tombstones WHERE sub_hash = \(SHA256.hexHash(sub))") == 0)
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'user.deleted'") == 1)
        // Nothing personal remains anywhere: no sub, e-mail, name or token in any table.
        let leftovers = try broker.pool.query(
            """
            SELECT string_agg(t::text, ' ') FROM (
                SELECT row_to_json(x)::text AS t FROM tombstones x UNION ALL SELECT row_to_json(x)::text FROM audit_log x
                UNION ALL SELECT row_to_json(x)::text FROM deletion_requests x UNION ALL SELECT row_to_json(x)::text FROM deletion_steps x
                UNION ALL SELECT row_to_json(x)::text FROM outbox_events x UNION ALL SELECT row_to_json(x)::text FROM apple_notifications x
            ) all_rows
            """
        ).single().decode(String.self, 0)
        #expect(!leftovers.contains(sub))
        #expect(!leftovers.contains(email))
        #expect(!revocations.map(\.token).contains { leftovers.contains($0) })

        // Afterwards: 410 with the original deletion id, and a new sign-in is a new user.
        let gone = try requestDeletion(broker, ["user_id": userID.lowercasedString, "reason": "x", "requested_by": "y"])
        #expect(gone.status == 410)
        #expect(gone.json["deletion_id"] as? String == deletionID)
        #expect(try requestDeletion(broker, ["apple_sub": sub, "reason": "x", "requested_by": "y"]).status == 410)
    }

    @Test("bad requests: unknown user 404, malformed id 400, missing scope 403, neither or both targets 400")
    func badInput() throws {
        let broker = try TestBroker(roles: [.api, .deletion], extra: Self.fast)
        #expect(
            try requestDeletion(broker, ["user_id": UUID().lowercasedString, "reason": "r", "requested_by": "q"]).status == 404)
        let malformed = try requestDeletion(broker, ["user_id": "nope", "reason": "r", "requested_by": "q"])
        #expect(malformed.status == 400)
        #expect(malformed.json["code"] as? String == "invalid_user_id")
        #expect(try requestDeletion(broker, ["reason": "r", "requested_by": "q"]).status == 400)
        #expect(
            try requestDeletion(
                broker, ["user_id": UUID().lowercasedString, "apple_sub": "x", "reason": "r", "requested_by": "q"]
            ).status == 400)
        #expect(try requestDeletion(broker, ["user_id": UUID().lowercasedString, "requested_by": "q"]).status == 400)
        let forbidden = try broker.post(
            "/v1/deletions", json: #"{"user_id":"\#(UUID().lowercasedString)","reason":"r","requested_by":"q"}"#,
            key: broker.key([.login, .read]))
        #expect(forbidden.status == 403)
        #expect(try broker.get("/v1/deletions/not-a-uuid", key: broker.key([.compliance])).status == 400)
        #expect(try broker.get("/v1/deletions/\(UUID().lowercasedString)", key: broker.key([.compliance])).status == 404)
        #expect(try broker.get("/v1/deletions?state=bogus", key: broker.key([.compliance])).status == 400)
        // U+0000 fits no text column; it was a 500 (found by schemathesis), it is a 400.
        let nul = try requestDeletion(broker, ["apple_sub": "a\u{0}b", "reason": "r", "requested_by": "q"])
        #expect(nul.status == 400, "\(nul.bodyText)")
        #expect((nul.json["detail"] as? String)?.contains("apple_sub") == true)
        let login = try broker.login([
            "identity_token": try broker.mint().idToken, "user": ["name": ["firstName": "Ada\u{0}", "lastName": "L"]],
        ])
        #expect(login.status == 400, "\(login.bodyText)")
        #expect(try broker.count("SELECT count(*) FROM apple_identities") == 0)
    }

    @Test("Apple failing half the revokes with 503 and 429 does not stop any deletion from completing")
    func flakyApple() throws {
        let broker = try TestBroker(roles: [.api, .deletion], extra: Self.fast)
        let users = try (0..<12).map { _ in try user(broker) }
        var faults = FaultSettings()
        faults.errorRate = 0.5
        faults.errorStatuses = [503, 503, 429]
        faults.retryAfterSeconds = 0
        faults.endpoints = ["revoke"]
        broker.simulator.faults = faults
        for (id, _) in users {
            #expect(
                try requestDeletion(broker, ["user_id": id.lowercasedString, "reason": "r", "requested_by": "q"]).status == 202)
        }
        try waitForDeletions(broker, seconds: 60)
        #expect(try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 12)
        #expect(broker.simulator.revocations.filter { $0.outcome == "revoked" }.count == 12)
        #expect(broker.simulator.revocations.contains { $0.outcome == "fault" }, "faults did happen")
        // Each token's successful revoke is recorded once, however many tries it took.
        #expect(try broker.count("SELECT count(*) FROM deletion_steps WHERE step = 'revoke' AND outcome = 'revoked'") == 12)
    }

    @Test("an account-delete notification ends done without calling revoke")
    func appleInitiated() throws {
        let broker = try TestBroker(roles: [.api, .notifications, .deletion], extra: Self.fast)
        let (userID, sub) = try user(broker)
        let result = try broker.simulator.sendNotification(
            NotificationRequest(
                url: broker.baseURL + "/v1/apple/notifications", type: "account-delete", sub: sub, clientID: TestBroker.clientID))
        #expect(result.status == 200)
        try waitForDeletions(broker)
        let steps = try broker.pool.query(
            "SELECT s.step, s.outcome FROM deletion_steps s JOIN deletion_requests d ON d.id = s.deletion_id WHERE d.user_id = \(userID) ORDER BY s.id"
        ).map { "\(try $0.decode(String.self, 0)):\(try $0.decode(String.self, 1))" }
        #expect(steps == ["revoke_skipped:skipped", "purge:done"])
        #expect(broker.simulator.revocations.isEmpty)
        #expect(
            try broker.pool.query("SELECT apple_revocation FROM deletion_requests").single().decode(String.self, 0)
                == "skipped_apple_initiated")
        #expect(try broker.count("SELECT count(*) FROM users") == 0)
    }

    @Test("a user with no stored token is recorded as nothing to revoke; failures dead-letter and can be retried")
    func nothingToRevokeAndDeadLetters() throws {
        let broker = try TestBroker(
            roles: [.api, .deletion], extra: Self.fast.merging(["BROKER_DELETION_MAX_ATTEMPTS": "2"]) { $1 })
        let plain = try broker.login(["identity_token": try broker.mint().idToken])
        let plainID = plain.json["user_id"] as! String
        #expect(try requestDeletion(broker, ["user_id": plainID, "reason": "r", "requested_by": "q"]).status == 202)
        try waitForDeletions(broker)
        #expect(try broker.count("SELECT count(*) FROM deletion_steps WHERE step = 'nothing_to_revoke'") == 1)

        failEveryRevoke(broker)
        let (stuckID, _) = try user(broker)
        let deletionID =
            try requestDeletion(broker, ["user_id": stuckID.lowercasedString, "reason": "r", "requested_by": "q"]).json[
                "deletion_id"] as! String
        try waitForDeletions(broker)
        let failed = try broker.get("/v1/deletions?state=failed", key: broker.key([.compliance]))
        let list = try #require(failed.json["deletions"] as? [[String: Any]])
        #expect(list.map { $0["deletion_id"] as? String } == [deletionID])
        #expect(list.first?["last_error"] as? String != nil)
        // Logins stay refused while the deletion waits.
        #expect(try broker.count("SELECT count(*) FROM users WHERE id = \(stuckID) AND status = 'deleting'") == 1)

        broker.simulator.faults = FaultSettings()
        let retried = try broker.post("/v1/deletions/\(deletionID)/retry", json: "{}", key: broker.key([.compliance]))
        #expect(retried.status == 202)
        try waitForDeletions(broker)
        #expect(try broker.get("/v1/deletions/\(deletionID)", key: broker.key([.compliance])).json["state"] as? String == "done")
        #expect(try broker.post("/v1/deletions/\(deletionID)/retry", json: "{}", key: broker.key([.compliance])).status == 409)
    }

    @Test("a dead-lettered deletion is returned by a second request, not reopened; the retry re-drives it to one user.deleted")
    func deadLetterIsRedrivenNotReopened() throws {
        let broker = try TestBroker(
            roles: [.api, .deletion], extra: Self.fast.merging(["BROKER_DELETION_MAX_ATTEMPTS": "2"]) { $1 })
        failEveryRevoke(broker)
        let (userID, _) = try user(broker)
        let body: [String: Any] = ["user_id": userID.lowercasedString, "reason": "r", "requested_by": "q"]
        let first = try requestDeletion(broker, body)
        let deletionID = try #require(first.json["deletion_id"] as? String)
        try waitForDeletions(broker)
        #expect(
            try broker.get("/v1/deletions/\(deletionID)", key: broker.key([.compliance])).json["state"] as? String == "failed")

        // The attack: ask again (twice) while it is dead-lettered, then let Apple recover.
        broker.simulator.faults = FaultSettings()
        for _ in 0..<2 {
            let again = try requestDeletion(broker, body)
            #expect(again.json["deletion_id"] as? String == deletionID, "the existing request, not a new one")
            #expect(again.json["created"] as? Bool == false)
            #expect(again.json["state"] as? String == "failed")
        }
        try waitForDeletions(broker)
        #expect(try broker.count("SELECT count(*) FROM deletion_requests WHERE user_id = \(userID)") == 1)
        #expect(try broker.count("SELECT count(*) FROM users WHERE id = \(userID)") == 1, "nothing ran until the retry")

        #expect(try broker.post("/v1/deletions/\(deletionID)/retry", json: "{}", key: broker.key([.compliance])).status == 202)
        try waitForDeletions(broker)
        #expect(try broker.get("/v1/deletions/\(deletionID)", key: broker.key([.compliance])).json["state"] as? String == "done")
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'user.deleted' AND user_id = \(userID)") == 1)
        #expect(try requestDeletion(broker, body).status == 410)
    }

    @Test(
        "the database refuses a second user.deleted for one user: a second request purged, a re-run purge, a retry beside an open request"
    )
    func userDeletedOnce() throws {
        let broker = try TestBroker(roles: [.api, .deletion], extra: Self.fast)
        let (userID, _) = try user(broker)
        #expect(
            try requestDeletion(broker, ["user_id": userID.lowercasedString, "reason": "r", "requested_by": "q"]).status == 202)
        try waitForDeletions(broker)
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'user.deleted' AND user_id = \(userID)") == 1)

        // What the previous release allowed: a second request for the user (beside a failed
        // one), driven to its purge. The purge raises and writes nothing.
        let second = UUID()
        try broker.pool.query(
            """
            INSERT INTO deletion_requests (id, user_id, source, reason, requested_by, state)
            VALUES (\(second), \(userID), 'api', 'again', 'q', 'purging')
            """)
        #expect(throws: PostgresError.self) {
            try broker.pool.query("SELECT broker_purge_user(\(second), '{}'::text[], '{}'::text[])")
        }
        #expect(try broker.count("SELECT count(*) FROM deletion_requests WHERE id = \(second) AND state = 'purging'") == 1)
        // Any writer, not only the purge: the event itself is refused.
        #expect(throws: PostgresError.self) {
            try broker.pool.query(
                "SELECT broker_emit_event('user.deleted', \(userID), jsonb_build_object('user_id', \(userID)::text))")
        }
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'user.deleted' AND user_id = \(userID)") == 1)
        #expect(try broker.count("SELECT count(*) FROM user_deleted_events WHERE user_id = \(userID)") == 1)

        // A failed request beside another request of its user is not re-driven.
        try broker.pool.query("UPDATE deletion_requests SET state = 'done' WHERE id = \(second)")
        let third = UUID()
        try broker.pool.query(
            """
            INSERT INTO deletion_requests (id, user_id, source, reason, requested_by, state)
            VALUES (\(third), \(userID), 'api', 'again', 'q', 'failed')
            """)
        #expect(try broker.post("/v1/deletions/\(third)/retry", json: "{}", key: broker.key([.compliance])).status == 409)
    }

    @Test("a deletion worker killed with SIGKILL three times during 200 deletions loses none and purges each once")
    func crashSafety() throws {
        // The API runs here; the deletion job runs in a separate broker process we kill.
        let broker = try TestBroker(roles: [.api, .notifications])
        let users = try (0..<200).map { _ in try user(broker) }
        var faults = FaultSettings()
        faults.latencyMilliseconds = 15
        faults.endpoints = ["revoke"]
        broker.simulator.faults = faults
        for (id, _) in users {
            #expect(
                try requestDeletion(broker, ["user_id": id.lowercasedString, "reason": "r", "requested_by": "q"]).status == 202)
        }
        var environment = broker.environment
        environment["BROKER_ROLES"] = "deletion"
        environment["APPLE_BASE_URL"] = broker.simulator.baseURL
        environment["BROKER_DELETION_LEASE_SECONDS"] = "2"
        environment["BROKER_DELETION_INTERVAL_SECONDS"] = "1"
        environment["BROKER_DELETION_RETRY_BASE_MS"] = "50"
        environment["BROKER_DELETION_CONCURRENCY"] = "4"
        environment["BROKER_LISTEN"] = "127.0.0.1:0"
        let log = TestFiles.path("deletion", suffix: ".log")
        func done() throws -> Int { try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") }
        var kills = 0
        while kills < 3 {
            let worker = try ChildProcess.start(BrokerExecutable.path, ["serve"], environment: environment, output: .file(log))
            let target = try done() + 30
            for _ in 0..<400 where try done() < target { Thread.sleep(forTimeInterval: 0.02) }
            worker.send(SIGKILL)
            worker.wait()
            kills += 1
        }
        #expect(try done() < 200, "the kills happened mid-run")
        let finisher = try ChildProcess.start(BrokerExecutable.path, ["serve"], environment: environment, output: .file(log))
        defer {
            finisher.send(SIGTERM)
            finisher.wait()
        }
        try waitForDeletions(broker, seconds: 90)
        #expect(try done() == 200)
        #expect(try broker.count("SELECT count(*) FROM users") == 0)
        #expect(try broker.count("SELECT count(*) FROM tombstones") == 200)
        #expect(try broker.count("SELECT count(*) FROM audit_log WHERE action = 'deletion.purged'") == 200, "each purge ran once")
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'user.deleted'") == 200)
        let revokedSubs = Set(
            broker.simulator.revocations.filter { $0.outcome == "revoked" || $0.outcome == "already_revoked" }.compactMap(\.sub))
        #expect(revokedSubs == Set(users.map(\.sub)), "every user's token was revoked at Apple")
    }

    @Test("the CLI requests and lists deletions")
    func commandLine() throws {
        let broker = try TestBroker(roles: [.api, .deletion], extra: Self.fast)
        let (userID, _) = try user(broker)
        let requested = try BrokerExecutable.run(
            ["delete-user", "--user-id", userID.lowercasedString, "--reason", "ticket 7", "--requested-by", "ops"],
            environment: broker.environment)
        #expect(requested.status == 0, "\(requested.stderr)")
        let deletionID = requested.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(UUID(uuidString: deletionID) != nil)
        try waitForDeletions(broker)
        let listed = try BrokerExecutable.run(["deletions", "list", "--state", "done"], environment: broker.environment)
        #expect(listed.status == 0)
        #expect(listed.stdout.contains(deletionID))
        let again = try BrokerExecutable.run(
            ["delete-user", "--user-id", userID.lowercasedString, "--reason", "x"], environment: broker.environment)
        #expect(again.status == 1)
        #expect(again.stderr.contains("user_deleted"))
    }
}
