import BrokerCore
import Console
import Foundation
import HTTPClient
import PostgresClient
import TestSupport
import Testing

/// BrokerCore's housekeeping worker drops the console's expired sessions and links through the
/// console's own pruning (its `ModulePruning` seam), a bounded batch a round.
@Suite("Console housekeeping", .offPool)
struct ConsoleHousekeepingTests {
    @Test("expired sessions and links go in batches of ConsoleSessionStore.pruneBatch; live ones stay and still sign in")
    func expiredSessionsPruned() throws {
        let broker = try ConsoleBroker()
        let expired = try broker.signIn(.viewer)
        try broker.pool.query("UPDATE console_sessions SET expires_at = now() - interval '1 minute'")
        let live = try broker.signIn(.viewer)
        let ended = try broker.signIn(.operator, operator: "bob")
        let csrf = try #require(ConsoleBroker.csrfToken(try broker.get("/", cookie: ended)))
        #expect(try broker.post("/logout", form: [("csrf_token", csrf)], cookie: ended).status == 303)
        // A pile of expired sessions beside them: one more than a batch in all.
        try broker.pool.query(
            """
            INSERT INTO console_sessions (id_hash, operator, operator_name, roles, auth_time, expires_at)
            SELECT sha256(i::text::bytea), 'x', 'x', '{viewer}', now(), now() - interval '1 hour'
            FROM generate_series(1, \(ConsoleSessionStore.pruneBatch)) i
            """)
        _ = try broker.link(.viewer, operator: "carol")
        try broker.pool.query("UPDATE console_links SET expires_at = now() - interval '1 minute'")
        _ = try broker.link(.viewer, operator: "dave")

        let housekeeping = Housekeeping(
            pool: broker.pool, eventRetention: .seconds(86_400), deadLetterRetention: .seconds(86_400),
            notificationRetention: .seconds(86_400), modules: [ConsoleSessionStore(pool: broker.pool)])
        #expect(try housekeeping.step(), "a full batch: more to do")
        #expect(try broker.count("SELECT count(*) FROM console_sessions WHERE expires_at < now()") == 1)
        #expect(try !housekeeping.step())
        #expect(try broker.count("SELECT count(*) FROM console_sessions WHERE expires_at < now()") == 0)
        // The live session and the ended one (kept until it expires, so a replay is refused) remain.
        #expect(try broker.count("SELECT count(*) FROM console_sessions") == 2)
        #expect(try broker.count("SELECT count(*) FROM console_links") == 1)
        #expect(try broker.get("/", cookie: live).status == 200)
        #expect(try broker.get("/", cookie: expired).status == 303)
        #expect(try broker.get("/", cookie: ended).status == 303)
    }
}
