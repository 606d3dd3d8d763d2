import Foundation
import Glibc
import Locking
import Observability
import Synchronization
import Workers

/// LISTENs on channels over a dedicated connection, on a thread of its own, and calls
/// handlers when a NOTIFY arrives. It reconnects with backoff when the connection breaks,
/// and after every (re)connect calls each handler once with an empty payload, because
/// notifications sent while disconnected are lost and waiters must re-check their queues.
public final class PostgresListener: Sendable {
    public typealias Handler = @Sendable (_ payload: String) -> Void

    private let configuration: PostgresConfiguration
    private let logger: Logger
    private let handlers = Lock<[String: [Handler]]>([:])
    private let stopped = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)
    private let started = Atomic<Bool>(false)

    public init(configuration: PostgresConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
    }

    /// Adds a handler for `channel` (lowercase letters, digits and `_`). Call before `start()`.
    public func subscribe(_ channel: String, _ handler: @escaping Handler) {
        precondition(channel.allSatisfy { $0.isLowercase || $0.isNumber || $0 == "_" }, "bad channel name")
        handlers.withLock { $0[channel, default: []].append(handler) }
    }

    /// Starts the listening thread.
    public func start() {
        guard !started.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let thread = Thread { [self] in
            run()
            finished.signal()
        }
        thread.name = "pg-listener"
        thread.start()
    }

    /// Stops the thread and waits (up to 2 s) for it to end.
    public func stop() {
        stopped.store(true, ordering: .releasing)
        if started.load(ordering: .acquiring) {
            _ = finished.wait(timeout: .now() + 2)
        }
    }

    /// The pause before connecting again: 0.1 s doubling to 5 s.
    static let reconnectBackoff = Backoff(first: .milliseconds(100), maximum: .seconds(5), jitter: .none)

    private func run() {
        var failures = 0
        while !stopped.load(ordering: .acquiring) {
            do {
                let connection = try PostgresConnection(configuration: configuration)
                if connection.isPooled {
                    // Through a transaction pooler the LISTEN stays on a server session that
                    // is soon another client's: nothing arrives, waiters fall back to polling.
                    logger.warning(
                        "LISTEN through a connection pooler receives no notifications; set DATABASE_LISTEN_URL to a direct connection"
                    )
                }
                let channels = handlers.withLock { Array($0.keys) }
                for channel in channels {
                    try connection.execute("LISTEN \(channel)")
                }
                failures = 0
                deliver(to: channels)
                listen(on: connection)
            } catch {
                logger.warning("listener connection failed", [("error", "\(error)")])
            }
            if stopped.load(ordering: .acquiring) { break }
            failures += 1
            Thread.sleep(forTimeInterval: Self.reconnectBackoff.delay(after: failures).seconds)
        }
    }

    private func listen(on connection: PostgresConnection) {
        while !stopped.load(ordering: .acquiring) {
            var descriptor = pollfd(fd: connection.socket, events: Int16(POLLIN), revents: 0)
            let ready = poll(&descriptor, 1, 250)
            if ready < 0 && errno != EINTR { return }
            if ready <= 0 { continue }
            let alive = connection.drainNotifications { channel, payload in
                for handler in handlers.withLock({ $0[channel] ?? [] }) { handler(payload) }
            }
            if !alive {
                logger.warning("listener connection lost; reconnecting")
                return
            }
        }
    }

    private func deliver(to channels: [String]) {
        for channel in channels {
            for handler in handlers.withLock({ $0[channel] ?? [] }) { handler("") }
        }
    }
}
