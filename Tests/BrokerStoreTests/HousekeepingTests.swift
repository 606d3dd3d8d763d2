import BrokerCore
import Foundation
import PostgresClient
import TestSupport
import Testing

/// BrokerCore's housekeeping runs other modules' pruning through its `ModulePruning` seam
/// (it never imports them), and asks again while one still has more.
@Suite("Housekeeping", .offPool)
struct HousekeepingTests {
    /// A module of the test's own: a table of its own, pruned two rows a round.
    struct TestModule: ModulePruning {
        let pool: PostgresPool

        func prune() throws -> Bool {
            try pool.query(
                "DELETE FROM test_module_rows WHERE id IN (SELECT id FROM test_module_rows ORDER BY id LIMIT 2) RETURNING 1"
            ).count == 2
        }
    }

    @Test("every module's pruning runs each round; a full batch asks for another round at once")
    func modulesPruned() throws {
        let fixture = try StoreFixture()
        try fixture.pool.query("CREATE TABLE test_module_rows (id serial PRIMARY KEY)")
        try fixture.pool.query("INSERT INTO test_module_rows SELECT FROM generate_series(1, 3)")
        let housekeeping = Housekeeping(
            pool: fixture.pool, eventRetention: .seconds(86_400), deadLetterRetention: .seconds(86_400),
            notificationRetention: .seconds(86_400), modules: [TestModule(pool: fixture.pool)])
        #expect(try housekeeping.step(), "two of three went: more to do")
        #expect(try !housekeeping.step())
        #expect(try fixture.count("SELECT count(*) FROM test_module_rows") == 0)
    }
}
