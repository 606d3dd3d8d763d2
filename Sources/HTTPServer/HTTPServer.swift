import CMicroHTTPDShims
import CMicroHTTPD
import Foundation
import Glibc
import Locking
import Observability
import StrictJSON
import Synchronization

/// An HTTP/1.1 server on GNU libmicrohttpd.
///
/// libmicrohttpd parses HTTP and runs a pool of worker threads; each request is handed
/// to the `Router`'s handler on one of those threads once its body has arrived. Handlers
/// are synchronous and may block (PostgreSQL, outbound HTTP): the pool is sized for that,
/// and blocking never touches Swift concurrency's cooperative threads.
///
/// The server adds to every exchange: a request id (`X-Request-Id`), the body limit
/// (413), 404/405 problems, RFC 9457 bodies for thrown errors, a JSON access-log line,
/// and request counts and latency in the metrics registry.
public final class HTTPServer: Sendable {
    public struct Configuration: Sendable {
        /// Address and port, `host:port` (`127.0.0.1:8080`, `0.0.0.0:8080`, `[::1]:8080`); port 0 picks one.
        public var listen: String = "127.0.0.1:8080"
        /// Worker threads; handlers block, so more than the core count.
        public var workerThreads: Int = max(4, ProcessInfo.processInfo.activeProcessorCount * 4)
        /// Largest accepted request body; larger gets 413.
        public var maximumBodyBytes: Int = 64 * 1024
        /// Idle seconds before a connection is closed.
        public var connectionTimeoutSeconds: Int = 30
        /// Most simultaneous connections.
        public var connectionLimit: Int = 1024
        /// Most simultaneous connections from one IP address; 0 = no limit (behind a proxy,
        /// where every connection comes from the proxy's address).
        public var connectionsPerAddress: Int = 0
        /// Seconds a connection may take to send a request's headers, counted from when it
        /// opens or its previous response went out; 0 = no deadline (idle timeout only).
        public var headerTimeoutSeconds: Int = 10
        /// libmicrohttpd's per-connection memory: the request line and headers must fit in it
        /// with room to spare for the response headers. Larger heads get libmicrohttpd's own
        /// 414 or 431 (plain HTML); the documented query parameters, percent-encoded at their
        /// longest, take under 34 KiB. A connection that has served a request holds all of
        /// it (libmicrohttpd zeroes the whole pool between requests): measured 48 KiB of RSS
        /// per open keep-alive connection at this size, 64 KiB at 64 KiB.
        public var connectionMemoryBytes: Int = 48 * 1024
        /// How long shutdown waits for in-flight requests.
        public var shutdownGracePeriod: Duration = .seconds(10)
        /// PEM private key and certificate chain for HTTPS; nil serves plain HTTP.
        public var tls: (keyPEM: String, certificatePEM: String)?
        /// Writes one `info` line per request.
        public var accessLog: Bool = true
        /// The prefix of problem `type` URIs (the code follows it); nil answers RFC 9457's
        /// `about:blank`.
        public var problemTypeBase: String?

        public init() {}

        /// The most memory requests can hold at once: every connection with its full pool
        /// (request line, headers, response headers) and a body at the limit.
        public var memoryBoundBytes: Int { connectionLimit * (connectionMemoryBytes + maximumBodyBytes) }
    }

    /// A failure to start listening.
    public struct StartError: Error, CustomStringConvertible {
        public let description: String
    }

    let core: ServerCore
    private let daemon = Lock<Daemon?>(nil)

    /// - Parameters:
    ///   - errorMapper: turns errors that are not `Problem`s into problems (for example a
    ///     database outage into 503); nil means 500.
    public init(
        configuration: Configuration, router: Router, logger: Logger, metrics: MetricsRegistry,
        errorMapper: @escaping @Sendable (any Error) -> Problem? = { _ in nil }
    ) {
        core = ServerCore(
            configuration: configuration, router: router, logger: logger, metrics: metrics, errorMapper: errorMapper)
    }

    /// Routes a request in process, exactly as a connection's request is routed (method
    /// check, route match, handler, error mapping), without a socket: for fast tests of
    /// routes and their problems. Works whether or not the server was started.
    public func respond(to request: HTTPRequest) -> HTTPResponse { core.respond(to: request).0 }

    /// Owns the running `MHD_Daemon` and stops it (joining its threads) in `deinit`.
    final class Daemon: @unchecked Sendable {
        let pointer: OpaquePointer
        init(_ pointer: OpaquePointer) { self.pointer = pointer }
        deinit { MHD_stop_daemon(pointer) }
    }

    /// Binds and starts serving.
    public func start() throws {
        let configuration = core.configuration
        let (address, isIPv6) = try Self.parse(configuration.listen)
        // poll(), not epoll: with epoll and a thread pool, MHD_quiesce_daemon races the workers
        // removing the listening socket from their epoll sets, and the loser aborts the process
        // ("Failed to remove listen FD from epoll set", an open libmicrohttpd defect; seen here
        // once in a test run). Connections per worker stay in the hundreds, where poll() costs
        // nothing measurable.
        var flags = MHD_USE_INTERNAL_POLLING_THREAD.rawValue | MHD_USE_POLL.rawValue | MHD_USE_ITC.rawValue
        if isIPv6 { flags |= MHD_USE_IPv6.rawValue }
        let keyPEM = configuration.tls.map { strdup($0.keyPEM) } ?? nil
        let certificatePEM = configuration.tls.map { strdup($0.certificatePEM) } ?? nil
        defer {
            free(keyPEM)
            free(certificatePEM)
        }
        if configuration.tls != nil { flags |= MHD_USE_TLS.rawValue }
        let context = Unmanaged.passUnretained(core).toOpaque()
        let started: OpaquePointer? = address.withUnsafeBytes { raw in
            var options = cbroker_mhd_config(
                flags: flags, port: 0,
                bind_address: raw.baseAddress!.assumingMemoryBound(to: sockaddr.self),
                thread_pool_size: UInt32(max(1, configuration.workerThreads)),
                connection_timeout: UInt32(configuration.connectionTimeoutSeconds),
                connection_memory_limit: configuration.connectionMemoryBytes,
                connection_limit: UInt32(configuration.connectionLimit),
                listen_backlog: 1024,
                per_ip_connection_limit: UInt32(max(0, configuration.connectionsPerAddress)),
                handler: serverAccessHandler, handler_cls: context,
                completed: serverRequestCompleted, completed_cls: context,
                connection_notify: core.headerDeadline == nil ? nil : serverConnectionNotify,
                connection_notify_cls: core.headerDeadline.map { Unmanaged.passUnretained($0).toOpaque() },
                tls_key_pem: keyPEM, tls_cert_pem: certificatePEM)
            return cbroker_mhd_start(&options)
        }
        guard let started else {
            throw StartError(description: "cannot listen on \(configuration.listen): \(String(cString: strerror(errno)))")
        }
        let running = Daemon(started)
        daemon.withLock { $0 = running }
        core.headerDeadline?.start()
        core.logger.notice(
            "listening",
            [("address", configuration.listen), ("port", String(port)),
             ("memory_bound_mib", String(configuration.memoryBoundBytes >> 20)),
             ("connections_per_address", configuration.connectionsPerAddress == 0 ? "unlimited" : String(configuration.connectionsPerAddress))])
    }

    /// The port actually bound (useful after listening on port 0).
    public var port: UInt16 {
        guard let daemon = daemon.withLock({ $0 }) else { return 0 }
        return cbroker_mhd_bound_port(daemon.pointer)
    }

    /// Stops accepting connections, lets in-flight requests finish (up to the grace
    /// period), then stops the worker threads.
    public func shutdown() {
        var running: Daemon? = daemon.withLock { value in
            defer { value = nil }
            return value
        }
        guard let pointer = running?.pointer else { return }
        core.shuttingDown.store(true, ordering: .releasing)
        // libmicrohttpd hands the listening socket back, but with its own threads running it
        // must stay open until MHD_stop_daemon: closed here, its number can be reused by
        // another socket of the process, and the stop then panics ("Failed to remove listen
        // FD from epoll set", seen in the test suite) or removes the wrong descriptor.
        let listener = MHD_quiesce_daemon(pointer)
        let deadline = ContinuousClock.now + core.configuration.shutdownGracePeriod
        while core.inFlight.load(ordering: .acquiring) > 0 && ContinuousClock.now < deadline {
            Thread.sleep(forTimeInterval: 0.01)
        }
        let abandoned = core.inFlight.load(ordering: .acquiring)
        running = nil  // The last reference: deinit stops the daemon and joins its threads.
        if listener >= 0 { close(listener) }
        core.headerDeadline?.stop()
        core.logger.notice("stopped", [("abandoned_requests", String(abandoned))])
    }

    /// Requests being processed right now.
    public var inFlightRequests: Int { core.inFlight.load(ordering: .acquiring) }

    private static func parse(_ listen: String) throws -> (address: [UInt8], isIPv6: Bool) {
        let host: String
        let portText: Substring
        if listen.hasPrefix("["), let close = listen.firstIndex(of: "]") {
            host = String(listen[listen.index(after: listen.startIndex)..<close])
            portText = listen[listen.index(after: close)...].dropFirst()
        } else if let colon = listen.lastIndex(of: ":") {
            host = String(listen[..<colon])
            portText = listen[listen.index(after: colon)...]
        } else {
            throw StartError(description: "listen address must be host:port, got '\(listen)'")
        }
        guard let port = UInt16(portText) else {
            throw StartError(description: "invalid port in listen address '\(listen)'")
        }
        var ipv4 = sockaddr_in()
        ipv4.sin_family = sa_family_t(AF_INET)
        ipv4.sin_port = port.bigEndian
        if inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host, &ipv4.sin_addr) == 1 {
            return (withUnsafeBytes(of: ipv4) { Array($0) }, false)
        }
        var ipv6 = sockaddr_in6()
        ipv6.sin6_family = sa_family_t(AF_INET6)
        ipv6.sin6_port = port.bigEndian
        if inet_pton(AF_INET6, host, &ipv6.sin6_addr) == 1 {
            return (withUnsafeBytes(of: ipv6) { Array($0) }, true)
        }
        throw StartError(description: "listen host must be an IP address, got '\(host)'")
    }
}

/// The state libmicrohttpd's callbacks reach through their context pointer.
final class ServerCore: Sendable {
    let configuration: HTTPServer.Configuration
    let router: Router
    let logger: Logger
    let errorMapper: @Sendable (any Error) -> Problem?
    let inFlight = Atomic<Int>(0)
    let shuttingDown = Atomic<Bool>(false)
    let requestCounter = Atomic<Int>(0)
    let requestIDPrefix = String(UInt64.random(in: 1...UInt64.max), radix: 36)
    let requestCount: CounterFamily
    let requestDuration: HistogramFamily
    let headerDeadline: HeaderDeadline?

    init(
        configuration: HTTPServer.Configuration, router: Router, logger: Logger, metrics: MetricsRegistry,
        errorMapper: @escaping @Sendable (any Error) -> Problem?
    ) {
        self.configuration = configuration
        self.router = router
        self.logger = logger
        self.errorMapper = errorMapper
        requestCount = metrics.counter(
            "http_requests_total", help: "HTTP requests by route, method and status.",
            labels: ["route", "method", "status"])
        requestDuration = metrics.histogram(
            "http_request_duration_seconds", help: "HTTP request latency by route and method.",
            labels: ["route", "method"])
        let expired = metrics.counter(
            "http_header_timeouts_total", help: "Connections closed because a request's headers did not arrive in time.")
        headerDeadline =
            configuration.headerTimeoutSeconds > 0
            ? HeaderDeadline(seconds: configuration.headerTimeoutSeconds, expired: expired) : nil
    }

    /// Routes a complete request and turns whatever happens into a response.
    func respond(to request: HTTPRequest) -> (HTTPResponse, route: String) {
        var request = request
        guard HTTPMethod.known.contains(request.method) else {
            return (answer(.notImplemented, path: request.path, requestID: request.requestID), "unmatched")
        }
        switch router.match(request.method, request.path) {
        case .notFound:
            return (answer(.notFound(path: request.path), path: request.path, requestID: request.requestID), "unmatched")
        case .methodNotAllowed(let allowed):
            let problem = Problem.methodNotAllowed(request.method, allowed: allowed)
            return (answer(problem, path: request.path, requestID: request.requestID), "unmatched")
        case .found(let route, let parameters):
            request.pathParameters = parameters
            request.route = route.pattern
            do {
                return (try route.handler(request), route.pattern)
            } catch {
                let problem = problem(for: error, route: route.pattern, logger: request.logger)
                return (answer(problem, path: request.path, requestID: request.requestID), route.pattern)
            }
        }
    }

    /// What a handler's error answers: a `Problem` as it is, a JSON field error 400, anything
    /// else what the error mapper makes of it or, when it knows nothing of it, 500 (logged).
    private func problem(for error: any Error, route: String, logger: Logger) -> Problem {
        switch error {
        case let problem as Problem:
            return problem
        case let error as JSONFieldError:
            return .badRequest(error.detail)
        default:
            if let problem = errorMapper(error) {
                if problem.status >= 500 { logger.warning("request failed", [("route", route), ("error", "\(error)")]) }
                return problem
            }
            logger.error("unhandled error", [("route", route), ("error_type", "\(type(of: error))"), ("error", "\(error)")])
            return .internalError
        }
    }

    /// `problem` as the response to a request for `path`, its `type` under the configured base.
    func answer(_ problem: Problem, path: String, requestID: String) -> HTTPResponse {
        problem.response(instance: path, requestID: requestID, typeBase: configuration.problemTypeBase)
    }

    /// The caller's `X-Request-Id` when it is a sane token, otherwise a fresh one.
    func requestID(from header: String?) -> String {
        if let header, (1...64).contains(header.utf8.count),
            header.utf8.allSatisfy({ $0.isASCIIAlphanumeric || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: ".") })
        {
            return header
        }
        // A random per-process prefix and a counter: unique, and no syscall per request
        // (Foundation's UUID() opens /dev/urandom every time).
        let sequence = requestCounter.add(1, ordering: .relaxed).newValue
        return requestIDPrefix + "-" + String(sequence, radix: 16)
    }
}

extension UInt8 {
    fileprivate var isASCIIAlphanumeric: Bool {
        (48...57).contains(self) || (65...90).contains(self) || (97...122).contains(self)
    }
}

/// Per-request state kept in libmicrohttpd's `con_cls` slot between callbacks.
final class RequestState {
    var body: [UInt8] = []
    var tooLarge = false
    let started = ContinuousClock.now
}

// MARK: - libmicrohttpd callbacks
//
// Plain functions, not closures: they run on libmicrohttpd's threads and must not be
// isolated to any actor. They recover the ServerCore from the context pointer.

private func serverAccessHandler(
    _ context: UnsafeMutableRawPointer?, _ connection: OpaquePointer?, _ url: UnsafePointer<CChar>?,
    _ method: UnsafePointer<CChar>?, _ version: UnsafePointer<CChar>?, _ uploadData: UnsafePointer<CChar>?,
    _ uploadSize: UnsafeMutablePointer<Int>?, _ slot: UnsafeMutablePointer<UnsafeMutableRawPointer?>?
) -> MHD_Result {
    guard let context, let connection, let slot, let uploadSize else { return .NO }
    let core = Unmanaged<ServerCore>.fromOpaque(context).takeUnretainedValue()

    guard let existing = slot.pointee else {
        // First call: headers are in, no body yet.
        let state = RequestState()
        slot.pointee = Unmanaged.passRetained(state).toOpaque()
        core.headerDeadline?.headersArrived(connection)
        core.inFlight.add(1, ordering: .relaxed)
        if let length = header(connection, "Content-Length").flatMap(Int.init),
            length > core.configuration.maximumBodyBytes
        {
            // Refuse before reading the body; the connection closes after this response.
            state.tooLarge = true
            return finish(core, connection, state, url: url, method: method)
        }
        return .YES
    }
    let state = Unmanaged<RequestState>.fromOpaque(existing).takeUnretainedValue()
    if uploadSize.pointee > 0 {
        if !state.tooLarge, let uploadData {
            if state.body.count + uploadSize.pointee > core.configuration.maximumBodyBytes {
                state.tooLarge = true
                state.body = []
            } else {
                uploadData.withMemoryRebound(to: UInt8.self, capacity: uploadSize.pointee) {
                    state.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: uploadSize.pointee))
                }
            }
        }
        uploadSize.pointee = 0
        return .YES
    }
    return finish(core, connection, state, url: url, method: method)
}

private func finish(
    _ core: ServerCore, _ connection: OpaquePointer, _ state: RequestState,
    url: UnsafePointer<CChar>?, method: UnsafePointer<CChar>?
) -> MHD_Result {
    let path = url.map { String(cString: $0) } ?? "/"
    let methodName = HTTPMethod(method.map { String(cString: $0) } ?? "GET")
    let requestID = core.requestID(from: header(connection, "X-Request-Id"))
    let logger = core.logger.with(("request_id", requestID))
    var response: HTTPResponse
    var route = "unmatched"
    if state.tooLarge {
        response = core.answer(.payloadTooLarge(limit: core.configuration.maximumBodyBytes), path: path, requestID: requestID)
        response.headers.set("Connection", "close")
    } else {
        let request = HTTPRequest(
            method: methodName, path: path, query: arguments(connection), headers: headers(connection),
            body: state.body, remoteAddress: clientAddress(connection), requestID: requestID, logger: logger)
        (response, route) = core.respond(to: request)
    }
    response.headers.set("X-Request-Id", requestID)
    // Nothing is sniffed into another type; HTTPS only from now on when we terminate TLS.
    response.headers.set("X-Content-Type-Options", "nosniff")
    if core.configuration.tls != nil { response.headers.set("Strict-Transport-Security", "max-age=31536000") }
    if core.shuttingDown.load(ordering: .relaxed) { response.headers.set("Connection", "close") }

    let elapsed = ContinuousClock.now - state.started
    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    core.requestCount.increment(route, methodName.label, String(response.status))
    core.requestDuration.observe(seconds, route, methodName.label)
    if core.configuration.accessLog {
        // An invented method is logged as `other` plus its first 32 bytes, never whole.
        let logged =
            methodName.label == "other"
            ? "other:" + String(decoding: methodName.rawValue.utf8.prefix(32), as: UTF8.self) : methodName.rawValue
        logger.info(
            "request",
            [("method", logged), ("route", route), ("status", String(response.status)),
             ("duration_ms", String(format: "%.2f", seconds * 1000))])
    }
    return queue(response, on: connection, omitBody: methodName == .head)
}

private func queue(_ response: HTTPResponse, on connection: OpaquePointer, omitBody: Bool) -> MHD_Result {
    let body = omitBody ? [] : response.body
    let mhdResponse: OpaquePointer? = body.withUnsafeBytes { raw in
        MHD_create_response_from_buffer(
            raw.count, UnsafeMutableRawPointer(mutating: raw.baseAddress), .RESPMEM_MUST_COPY)
    }
    guard let mhdResponse else { return .NO }
    defer { MHD_destroy_response(mhdResponse) }
    for (name, value) in response.headers {
        _ = MHD_add_response_header(mhdResponse, name, value)
    }
    return MHD_queue_response(connection, UInt32(response.status), mhdResponse)
}

private func serverRequestCompleted(
    _ context: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
    _ slot: UnsafeMutablePointer<UnsafeMutableRawPointer?>?, _ reason: MHD_RequestTerminationCode
) {
    guard let context, let slot, let state = slot.pointee else { return }
    Unmanaged<RequestState>.fromOpaque(state).release()
    slot.pointee = nil
    let core = Unmanaged<ServerCore>.fromOpaque(context).takeUnretainedValue()
    core.inFlight.subtract(1, ordering: .relaxed)
    if let connection { core.headerDeadline?.responseSent(connection) }
}

private func header(_ connection: OpaquePointer, _ name: String) -> String? {
    MHD_lookup_connection_value(connection, .HEADER_KIND, name).map { String(cString: $0) }
}

/// Collects key/value pairs of one kind through MHD's iterator callback.
private final class PairCollector {
    var pairs: [(String, String)] = []
}

private func collectPair(
    _ context: UnsafeMutableRawPointer?, _ kind: MHD_ValueKind, _ key: UnsafePointer<CChar>?,
    _ value: UnsafePointer<CChar>?
) -> MHD_Result {
    guard let context, let key else { return .YES }
    let collector = Unmanaged<PairCollector>.fromOpaque(context).takeUnretainedValue()
    collector.pairs.append((String(cString: key), value.map { String(cString: $0) } ?? ""))
    return .YES
}

private func pairs(_ connection: OpaquePointer, _ kind: MHD_ValueKind) -> [(String, String)] {
    let collector = PairCollector()
    withExtendedLifetime(collector) {
        _ = MHD_get_connection_values(connection, kind, collectPair, Unmanaged.passUnretained(collector).toOpaque())
    }
    return collector.pairs
}

private func headers(_ connection: OpaquePointer) -> HTTPHeaders {
    HTTPHeaders(pairs(connection, .HEADER_KIND))
}

private func arguments(_ connection: OpaquePointer) -> [String: String] {
    var query: [String: String] = [:]
    for (key, value) in pairs(connection, .GET_ARGUMENT_KIND) where query[key] == nil {
        query[key] = value
    }
    return query
}

private func clientAddress(_ connection: OpaquePointer) -> String {
    var buffer = [CChar](repeating: 0, count: 64)
    guard cbroker_mhd_client_address(connection, &buffer, buffer.count) == 0 else { return "" }
    return String(decoding: buffer.prefix { $0 != 0 }.map(UInt8.init(bitPattern:)), as: UTF8.self)
}
