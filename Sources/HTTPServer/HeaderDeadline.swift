import CMicroHTTPD
import CMicroHTTPDShims
import Foundation
import Glibc
import Locking
import Observability
import Synchronization

/// Closes connections whose request (headers, then body) does not arrive in time.
///
/// libmicrohttpd's timeout counts idle time only: a client that sends one header byte
/// every few seconds (slowloris) keeps its connection for ever. This deadline counts from
/// the moment a connection opens, or from the end of its previous response when it is kept
/// alive, to the moment its request's headers are complete; a connection past it is shut
/// down (`shutdown(2)`, which libmicrohttpd then sees as a closed peer and cleans up).
///
/// Connections are tracked from libmicrohttpd's connection notifications. The CLOSED
/// notification comes before libmicrohttpd closes the socket, and both it and the
/// watchdog's `shutdown` hold the same lock, so a socket number is never shut down after
/// it may have been reused.
final class HeaderDeadline: Sendable {
    private struct Waiting {
        var socket: Int32
        /// When the connection started waiting for headers; nil while a request is being served.
        var since: ContinuousClock.Instant?
    }

    let seconds: Int
    private let connections = Lock<[UInt: Waiting]>([:])
    private let stopped = Atomic<Bool>(false)
    private let expired: CounterFamily

    init(seconds: Int, expired: CounterFamily) {
        self.seconds = seconds
        self.expired = expired
    }

    private static func key(_ connection: OpaquePointer) -> UInt {
        UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(connection)))
    }

    func opened(_ connection: OpaquePointer) {
        let socket = cbroker_mhd_connection_fd(connection)
        guard socket >= 0 else { return }
        connections.withLock { $0[Self.key(connection)] = Waiting(socket: socket, since: .now) }
    }

    func closed(_ connection: OpaquePointer) {
        _ = connections.withLock { $0.removeValue(forKey: Self.key(connection)) }
    }

    /// The request's headers are complete.
    func headersArrived(_ connection: OpaquePointer) {
        connections.withLock { $0[Self.key(connection)]?.since = nil }
    }

    /// The response went out; a kept-alive connection waits for its next request's headers.
    func responseSent(_ connection: OpaquePointer) {
        connections.withLock { $0[Self.key(connection)]?.since = .now }
    }

    /// Checks every half second until `stop()`, on a thread of its own.
    func start() {
        let thread = Thread { [self] in
            while !stopped.load(ordering: .relaxed) {
                Thread.sleep(forTimeInterval: 0.5)
                sweep()
            }
        }
        thread.name = "http-header-deadline"
        thread.start()
    }

    func stop() { stopped.store(true, ordering: .relaxed) }

    private func sweep() {
        let deadline = ContinuousClock.now - .seconds(seconds)
        let count = connections.withLock { connections in
            var count = 0
            for (key, entry) in connections {
                guard let since = entry.since, since < deadline else { continue }
                Glibc.shutdown(entry.socket, Int32(SHUT_RDWR))
                connections[key]?.since = nil  // once; CLOSED removes it
                count += 1
            }
            return count
        }
        if count > 0 { expired.increment(by: Double(count)) }
    }
}

/// libmicrohttpd's connection notification: feeds the header deadline and the connection cap.
func serverConnectionNotify(
    _ context: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
    _ socketContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>?,
    _ code: MHD_ConnectionNotificationCode
) {
    guard let context, let connection else { return }
    let core = Unmanaged<ServerCore>.fromOpaque(context).takeUnretainedValue()
    // MHD_CONNECTION_NOTIFY_STARTED is 0; the other code is CLOSED.
    let started = code.rawValue == 0
    if let deadline = core.headerDeadline {
        if started { deadline.opened(connection) } else { deadline.closed(connection) }
    }
    if let cap = core.connectionCap {
        let address = clientAddress(connection)
        if started { cap.opened(address) } else { cap.closed(address) }
    }
}
