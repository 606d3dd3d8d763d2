import Deliveries
import Foundation
import HTTPClient
import HTTPServer
import Locking
import Observability
import PostgresClient
import Synchronization
import TestSupport
import Testing
import Workers

/// The delivery engine on its own: a lane over a table with the queue's columns in a fresh
/// migrated database and a receiver on loopback; no broker. Each lane's own rules (webhooks,
/// Back-Channel Logout) are tested end to end in BrokerCoreTests and OpenIDProviderTests.
@Suite("Delivery engine", .offPool)
struct DeliveryEngineTests {
    /// A receiver on loopback answering `answer` and keeping the bodies it got.
    final class Receiver: Sendable {
        private final class State: Sendable {
            let status = Lock<Int>(200)
            let received = Lock<[String]>([])
        }
        private let state = State()
        let server: HTTPServer
        var url: String { "http://127.0.0.1:\(server.port)/hook" }
        var received: [String] { state.received.withLock { $0 } }
        func answer(_ status: Int) { state.status.withLock { $0 = status } }

        init() throws {
            var router = Router()
            let state = state
            router.post("/hook") { request in
                state.received.withLock { $0.append(String(decoding: request.body, as: UTF8.self)) }
                return HTTPResponse(status: state.status.withLock { $0 })
            }
            server = try startLoopbackServer(router, label: "receiver")
        }

        deinit { server.shutdown() }
    }

    /// A lane of the test's own over `test_deliveries`: the queue's columns and a URL and a body.
    struct TestLane: DeliveryLane {
        let queue: DeliveryQueueStore
        /// The lane's rule for which answers are final (Back-Channel Logout makes 400 one).
        var finalStatuses: Set<Int> = []

        var names: DeliveryLaneNames { DeliveryLaneNames(metricPrefix: "test", title: "Test") }

        struct Item: Sendable {
            var url: String
            var body: String
        }

        func claim(lease: Duration) throws -> ClaimedDelivery<Item>? {
            try queue.claimOldestDue(lease: lease, returning: "url, body").map {
                ClaimedDelivery(
                    id: try $0.decode(Int64.self, "id"), attempts: try $0.decode(Int.self, "attempts"),
                    createdAt: try $0.decode(Date.self, "created_at"),
                    item: Item(url: try $0.decode(String.self, "url"), body: try $0.decode(String.self, "body")))
            }
        }

        func request(for delivery: ClaimedDelivery<Item>) throws -> HTTPClientRequest {
            HTTPClientRequest(method: "POST", url: delivery.item.url, body: Array(delivery.item.body.utf8))
        }

        func verdict(status: Int) -> DeliveryVerdict {
            if (200..<300).contains(status) { return .delivered }
            return finalStatuses.contains(status) ? .dead : .retry
        }
    }

    struct Fixture {
        let pool: PostgresPool
        let lane: TestLane
        let metrics = MetricsRegistry()
        let receiver: Receiver

        init(finalStatuses: Set<Int> = []) throws {
            pool = PostgresPool(
                configuration: .init(connection: try TestPostgres.freshDatabase(), maximumConnections: 4),
                logger: Logger(label: "test", sink: LogSink(level: .error)))
            // The queue's columns, as every lane table has them (DeliveryQueueStore), and the lane's own.
            try pool.query(
                """
                CREATE TABLE test_deliveries (
                    id bigserial PRIMARY KEY, url text NOT NULL, body text NOT NULL,
                    state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
                    attempts integer NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL DEFAULT now(),
                    last_status integer, last_error text, created_at timestamptz NOT NULL DEFAULT now(),
                    delivered_at timestamptz)
                """)
            lane = TestLane(
                queue: DeliveryQueueStore(pool: pool, table: DeliveryTable("test_deliveries")), finalStatuses: finalStatuses)
            receiver = try Receiver()
        }

        func engine(allowPrivateNetworks: Bool = true, maximumAge: Duration = .seconds(3600)) -> DeliveryEngine<TestLane> {
            DeliveryEngine(
                lane: lane, transport: CurlTransport(),
                settings: DeliverySettings(
                    timeout: .seconds(5), backoff: Backoff(first: .seconds(10), maximum: .seconds(60)), maximumAge: maximumAge,
                    lease: .seconds(30), dnsTimeout: .seconds(1), allowPrivateNetworks: allowPrivateNetworks),
                metrics: metrics, logger: Logger(label: "engine", sink: LogSink(level: .error)))
        }

        @discardableResult
        func queue(_ body: String = "hello", createdAgo: Duration = .zero) throws -> Int64 {
            try pool.query(
                """
                INSERT INTO test_deliveries (url, body, created_at) VALUES (\(receiver.url), \(body), now() - \(createdAgo)::interval)
                RETURNING id
                """
            ).single().decode(Int64.self, "id")
        }

        struct Row {
            var state: String
            var attempts: Int
            var lastStatus: Int?
            var lastError: String?
            /// Seconds until the next attempt (negative: due).
            var dueIn: Double
        }

        func row(_ id: Int64) throws -> Row {
            let row = try pool.query(
                """
                SELECT state, attempts, last_status, last_error,
                       EXTRACT(EPOCH FROM next_attempt_at - now())::float8 AS due_in
                FROM test_deliveries WHERE id = \(id)
                """
            ).single()
            return Row(
                state: try row.decode(String.self, "state"), attempts: try row.decode(Int.self, "attempts"),
                lastStatus: try row.decode(Int?.self, "last_status"), lastError: try row.decode(String?.self, "last_error"),
                dueIn: try row.decode(Double.self, "due_in"))
        }

        func outcomes() -> String {
            metrics.render().split(separator: "\n").filter { $0.hasPrefix("test_deliveries_total") }.joined(separator: "\n")
        }
    }

    @Test("a 2xx is delivered once; nothing due is no work")
    func delivered() throws {
        let fixture = try Fixture()
        let id = try fixture.queue("one")
        let engine = fixture.engine()
        #expect(try engine.step())
        #expect(try !engine.step(), "a delivered row is not claimed again")
        let row = try fixture.row(id)
        #expect(row.state == "delivered" && row.attempts == 1 && row.lastStatus == 200 && row.lastError == nil)
        #expect(fixture.receiver.received == ["one"])
        #expect(fixture.outcomes().contains("outcome=\"delivered\"} 1"))
    }

    @Test("an answer the lane retries comes back after the backoff, with the status and its category")
    func retried() throws {
        let fixture = try Fixture()
        fixture.receiver.answer(503)
        let id = try fixture.queue()
        let engine = fixture.engine()
        #expect(try engine.step())
        var row = try fixture.row(id)
        #expect(row.state == "pending" && row.attempts == 1 && row.lastStatus == 503 && row.lastError == "http_status")
        // First backoff: between half and all of 10 s.
        #expect(row.dueIn > 4 && row.dueIn <= 10, "\(row.dueIn)")
        #expect(try !engine.step(), "not due before its backoff")
        try fixture.pool.query("UPDATE test_deliveries SET next_attempt_at = now() WHERE id = \(id)")
        fixture.receiver.answer(204)
        #expect(try engine.step())
        row = try fixture.row(id)
        #expect(row.state == "delivered" && row.attempts == 2 && row.lastStatus == 204)
        #expect(fixture.outcomes().contains("outcome=\"retry\"} 1"))
    }

    @Test("an answer the lane's rule calls final is a dead letter at once; a re-drive queues it as new")
    func finalAnswer() throws {
        let fixture = try Fixture(finalStatuses: [400])
        fixture.receiver.answer(400)
        let id = try fixture.queue()
        #expect(try fixture.engine().step())
        var row = try fixture.row(id)
        #expect(row.state == "failed" && row.attempts == 1 && row.lastStatus == 400 && row.lastError == "rejected")
        #expect(fixture.outcomes().contains("outcome=\"failed\"} 1"))
        #expect(try fixture.lane.queue.backlog()?.deadLetters == 1)

        #expect(try fixture.lane.queue.redrive(id))
        #expect(try !fixture.lane.queue.redrive(id), "only a dead letter is re-driven")
        row = try fixture.row(id)
        #expect(row.state == "pending" && row.attempts == 0 && row.dueIn <= 0)
        // The same answer under a lane that retries it is not final.
        let retrying = try Fixture()
        retrying.receiver.answer(400)
        let other = try retrying.queue()
        #expect(try retrying.engine().step())
        #expect(try retrying.row(other).state == "pending")
    }

    @Test("past the maximum age a failure is final")
    func maximumAge() throws {
        let fixture = try Fixture()
        fixture.receiver.answer(500)
        let id = try fixture.queue(createdAgo: .seconds(7200))
        #expect(try fixture.engine(maximumAge: .seconds(3600)).step())
        #expect(try fixture.row(id).state == "failed")
    }

    @Test("a claim is a lease: another lane cannot take the row until it ends")
    func lease() throws {
        let fixture = try Fixture()
        let id = try fixture.queue()
        let first = try #require(try fixture.lane.claim(lease: .seconds(30)))
        #expect(first.id == id && first.attempts == 1)
        #expect(try fixture.lane.claim(lease: .seconds(30)) == nil, "leased")
        // A lane that died: the lease runs out and the row is claimed again, the attempt counted.
        try fixture.pool.query("UPDATE test_deliveries SET next_attempt_at = now() - interval '1 second' WHERE id = \(id)")
        let again = try #require(try fixture.lane.claim(lease: .seconds(30)))
        #expect(again.id == id && again.attempts == 2)
    }

    @Test("with private networks refused, a loopback receiver is address_not_allowed and never reached")
    func addressRefused() throws {
        let fixture = try Fixture()
        let id = try fixture.queue()
        #expect(try fixture.engine(allowPrivateNetworks: false).step())
        let row = try fixture.row(id)
        #expect(row.state == "pending" && row.lastStatus == nil && row.lastError == "address_not_allowed")
        #expect(fixture.receiver.received.isEmpty)
    }

    @Test("pruning keeps what is due and drops old delivered rows and old dead letters")
    func prune() throws {
        let fixture = try Fixture()
        let due = try fixture.queue(createdAgo: .seconds(10 * 86_400))
        let delivered = try fixture.queue()
        let dead = try fixture.queue(createdAgo: .seconds(10 * 86_400))
        try fixture.pool.query(
            "UPDATE test_deliveries SET state = 'delivered', delivered_at = now() - interval '3 days' WHERE id = \(delivered)")
        try fixture.pool.query("UPDATE test_deliveries SET state = 'failed' WHERE id = \(dead)")
        #expect(try fixture.lane.queue.prune(retention: .seconds(86_400), deadLetterRetention: .seconds(5 * 86_400)) == 2)
        let left = try fixture.pool.query("SELECT id FROM test_deliveries").map { try $0.decode(Int64.self, "id") }
        #expect(left == [due])
    }
}
