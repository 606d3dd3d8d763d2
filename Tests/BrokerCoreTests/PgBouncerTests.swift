import AppleSimulator
import BrokerCore
import Foundation
import HTTPClient
import Observability
import PostgresClient
import TestSupport
import Testing

/// Issue 29 item 7: the broker through Debian's PgBouncer 1.18 in transaction pooling with
/// its default settings (which refuse the `options` startup parameter and cannot route named
/// prepared statements), LISTEN on a direct connection (`DATABASE_LISTEN_URL`).
@Suite("PgBouncer in transaction pooling", .offPool, .enabled(if: TestPgBouncer.isInstalled, "apt-get install pgbouncer"))
struct PgBouncerTests {
    @Test("logins, Apple notifications, deletions and the sweep all work through PgBouncer")
    func everythingThroughPgBouncer() throws {
        let database = try TestPostgres.freshDatabase()
        // Two server connections for the broker's many: transactions of different callers
        // interleave on each, so any session state one assumed would be seen by another.
        let bouncer = try TestPgBouncer(database: database, poolSize: 2)
        let url = try bouncer.url(for: database)
        let broker = try TestBroker(
            database: try PostgresConfiguration(connectionString: url), roles: TestBroker.allRoles,
            extra: DeletionTests.fast.merging([
                "DATABASE_LISTEN_URL": database.connectionString, "BROKER_SWEEP_INTERVAL_SECONDS": "1",
            ]) { $1 })
        let name = String(url.split(separator: "/").last!)
        // PgBouncer's backend key is its own: the client finds out it is pooled.
        #expect(try PostgresConnection(configuration: try PostgresConfiguration(connectionString: url)).isPooled)

        // Logins: new users, a repeat login, a second app.
        let (userID, sub) = try broker.signIn(clients: [TestBroker.clientID, TestBroker.webClientID])
        let repeatLogin = try broker.login(["identity_token": try broker.mint { $0.sub = sub }.idToken])
        #expect(repeatLogin.status == 200)
        #expect(repeatLogin.json["user_id"] as? String == userID.lowercasedString)
        // Its read went through the pool: named statements and a read-only session are not ours there.
        #expect(broker.pool.statistics.pipelinedReads == 0)

        // An Apple notification: consent revoked for a second user.
        let (_, revokedSub) = try broker.signIn()
        let notification = try broker.simulator.sendNotification(
            NotificationRequest(
                url: broker.baseURL + "/v1/apple/notifications", type: "consent-revoked", sub: revokedSub,
                clientID: TestBroker.clientID))
        #expect(notification.status == 200)
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") == 1)

        // The sweep: a third user's refresh token dies at Apple (a password change), found by
        // the refresh and recorded as a dead token, the consent kept (protocol reference §11.3).
        let (_, sweptSub) = try broker.signIn()
        #expect(broker.simulator.changePassword(teamID: TestBroker.teamID, sub: sweptSub) == 1)
        try broker.pool.query("UPDATE apple_tokens SET next_validation_at = now()")
        for _ in 0..<100 where try broker.count("SELECT count(*) FROM apple_tokens WHERE revoked_reason = 'token_invalid'") < 1 {
            Thread.sleep(forTimeInterval: 0.1)
        }
        #expect(try broker.count("SELECT count(*) FROM apple_tokens WHERE revoked_reason = 'token_invalid'") == 1)
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") == 1)

        // A deletion, revoked at Apple and purged by the deletion worker.
        let body = try JSONSerialization.data(withJSONObject: [
            "user_id": userID.lowercasedString, "reason": "asked", "requested_by": "support",
        ])
        let requested = try broker.post(
            "/v1/deletions", json: String(decoding: body, as: UTF8.self), key: broker.key([.compliance]))
        #expect(requested.status == 202, "\(requested.bodyText)")
        for _ in 0..<300 where try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") < 1 {
            Thread.sleep(forTimeInterval: 0.1)
        }
        #expect(try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 1)
        #expect(try broker.count("SELECT count(*) FROM users WHERE id = \(userID)") == 0)

        // Everything above went through PgBouncer (and nothing broke: no 42P05, no refused startup).
        #expect(try bouncer.transactions(database: name) > 20)
        #expect(!bouncer.log.contains("unsupported startup parameter"), "\(bouncer.log)")
        let problems = broker.logs.capturedLines.filter { $0.contains("\"level\":\"error\"") }
        #expect(problems.isEmpty, "\(problems)")
    }

    @Test("a connection PgBouncer refuses is reported with its reason")
    func refusalNamesTheReason() throws {
        let database = try TestPostgres.freshDatabase()
        let bouncer = try TestPgBouncer(database: database)
        // A user PgBouncer does not know (auth_file lists only the cluster's superuser).
        let url = try bouncer.url(for: database).replacingOccurrences(of: "://broker@", with: "://nobody@")
        let error = #expect(throws: PostgresError.self) {
            try PostgresConnection(configuration: try PostgresConfiguration(connectionString: url))
        }
        #expect(error?.code == .connectionFailed)
        // PgBouncer's own words, not only `connection_failed`.
        #expect(error.map { "\($0)" }?.contains("authentication failed") == true, "\(String(describing: error))")
    }

    @Test("a listener through PgBouncer says it hears nothing and names DATABASE_LISTEN_URL")
    func listenerThroughPooler() throws {
        let database = try TestPostgres.freshDatabase()
        let bouncer = try TestPgBouncer(database: database)
        let sink = LogSink.capturing(level: .warning)
        let listener = PostgresListener(
            configuration: try PostgresConfiguration(connectionString: try bouncer.url(for: database)),
            logger: Logger(label: "listener", sink: sink))
        listener.subscribe("wakeup") { _ in }
        listener.start()
        defer { listener.stop() }
        for _ in 0..<100 where sink.capturedLines.isEmpty { Thread.sleep(forTimeInterval: 0.05) }
        #expect(sink.capturedLines.contains { $0.contains("DATABASE_LISTEN_URL") }, "\(sink.capturedLines)")
    }
}
