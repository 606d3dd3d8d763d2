import BrokerAPI
import Foundation
import HTTPClient
import Locking
import Observability
import PostgresClient
import Synchronization
import TestSupport
import Testing
import Workers

@testable import BrokerCore

@Suite("Worker lanes", .offPool)
struct WorkerGroupTests {
    /// A queue of work items that lanes claim one at a time, each taking a while, and what
    /// the lanes did with it.
    final class Work: Sendable {
        struct State {
            var pending = 0
            var steps = 0
            var busy = 0
            var mostBusy = 0
            var lanes: Set<UInt> = []
        }
        let state = Lock(State())

        /// One step as a lane runs it: claim an item if there is one.
        func step() -> Bool {
            let claimed = state.withLock { state -> Bool in
                state.steps += 1
                guard state.pending > 0 else { return false }
                state.pending -= 1
                state.busy += 1
                state.mostBusy = max(state.mostBusy, state.busy)
                state.lanes.insert(UInt(pthread_self()))  // each lane is a thread of its own
                return true
            }
            guard claimed else { return false }
            Thread.sleep(forTimeInterval: 0.02)  // a blocking call, say to Apple
            state.withLock { $0.busy -= 1 }
            return true
        }
    }

    private func group(_ work: Work, lanes: Int) -> WorkerGroup {
        // An hour's interval: every step after the first comes from a wake, not the timer.
        WorkerGroup(
            name: "test-lane", lanes: lanes, interval: .seconds(3600),
            logger: Logger(label: "test", sink: .capturing(level: .error)),
            step: { work.step() })
    }

    @Test("one wake with nothing to do costs one step, not one per lane")
    func idleWakeIsOneStep() throws {
        let work = Work()
        let lanes = group(work, lanes: 4)
        lanes.start()
        defer { lanes.stop() }
        // Each lane looks once when it starts.
        waitUntil(seconds: 5) { work.state.withLock { $0.steps } >= 4 }
        #expect(work.state.withLock { $0.steps } == 4)
        lanes.wake()
        waitUntil(seconds: 5) { work.state.withLock { $0.steps } >= 5 }
        Thread.sleep(forTimeInterval: 0.3)  // room for any extra wake to show up
        #expect(work.state.withLock { $0.steps } == 5)
    }

    @Test("one wake for a backlog spreads to every lane, which then drain it together")
    func wakeCascadesOverABacklog() throws {
        let work = Work()
        let lanes = group(work, lanes: 4)
        lanes.start()
        defer { lanes.stop() }
        waitUntil(seconds: 5) { work.state.withLock { $0.steps } >= 4 }
        work.state.withLock { $0.pending = 60 }
        lanes.wake()
        waitUntil(seconds: 10) { work.state.withLock { $0.pending == 0 && $0.busy == 0 } }
        let state = work.state.withLock { $0 }
        #expect(state.pending == 0, "the backlog drained after a single wake")
        #expect(state.lanes.count == 4, "every lane took part: \(state.lanes.sorted())")
        #expect(state.mostBusy >= 3, "lanes worked at the same time")
    }
}

@Suite("Active subscription probe", .offPool)
struct ActiveSubscriptionProbeTests {
    @Test("answers from PostgreSQL, remembers for a second, and says yes when it cannot ask")
    func probe() throws {
        let broker = try TestBroker(roles: [.api])
        let probe = ActiveSubscriptionProbe(pool: broker.pool)
        #expect(probe.anyActive() == false)
        let admin = try broker.key([.admin])
        let created = try broker.post(
            "/v1/webhook-subscriptions", json: #"{"url":"http://127.0.0.1:9/hook","topics":["*"]}"#, key: admin)
        #expect(created.status == 201)
        #expect(probe.anyActive() == false, "the answer is remembered for a second")
        waitUntil(seconds: 3) { probe.anyActive() }
        #expect(probe.anyActive() == true)

        let id = try #require(created.json["id"] as? String)
        #expect(try broker.post("/v1/webhook-subscriptions/\(id)/pause", json: "{}", key: admin).status == 200)
        waitUntil(seconds: 3) { !probe.anyActive() }
        #expect(probe.anyActive() == false, "a paused subscription receives nothing")

        // A database it cannot reach: wake anyway (a needless wake costs one claim).
        let unreachable = try PostgresConfiguration(connectionString: "postgres://nobody@127.0.0.1:1/none")
        let deadPool = PostgresPool(configuration: .init(connection: unreachable, maximumConnections: 1))
        #expect(ActiveSubscriptionProbe(pool: deadPool).anyActive() == true)
    }
}
