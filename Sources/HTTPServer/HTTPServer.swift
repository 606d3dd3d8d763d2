import CMicroHTTPD
import CMicroHTTPDShims
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
/// The server adds to every exchange, as its own middleware chain (Middleware.swift): a
/// request id (`X-Request-Id`), the client address behind trusted proxies, security headers,
/// request counts and latency in the metrics registry, a JSON access-log line, and RFC 9457
/// bodies for thrown errors; and the body limit (413) and 404/405/501 problems.
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
        /// Most simultaneous connections from one client address, IPv6 per /64 (`ConnectionCap`);
        /// 0 = no limit. Trusted proxies are not capped.
        public var connectionsPerAddress: Int = 0
        /// Seconds a connection may take to send a request's headers and body, counted from
        /// when it opens or its previous response went out; 0 = no deadline (idle timeout only).
        public var headerTimeoutSeconds: Int = 10
        /// libmicrohttpd's per-connection memory: the request line and headers must fit in it
        /// with room to spare for the response headers. Larger heads get libmicrohttpd's own
        /// 414 or 431: a short HTML page with no `Content-Type` (0.9.75 sets none on its error
        /// answers and has no option to; docs/openapi.json promises no media type). The
        /// documented query parameters, percent-encoded at their longest, take under 34 KiB. A connection that has served a request holds all of
        /// it (libmicrohttpd zeroes the whole pool between requests): measured 48 KiB of RSS
        /// per open keep-alive connection at this size, 64 KiB at 64 KiB.
        public var connectionMemoryBytes: Int = 48 * 1024
        /// How long shutdown waits for in-flight requests.
        public var shutdownGracePeriod: Duration = .seconds(10)
        /// PEM private key and certificate chain for HTTPS; nil serves plain HTTP.
        public var tls: (keyPEM: String, certificatePEM: String)?
        /// Writes one `info` line per request.
        public var accessLog: Bool = true
        /// Proxies whose `X-Forwarded-For` names the client (`ClientAddress`); empty: the
        /// peer is the client.
        public var trustedProxies: [ClientAddress.Range] = []
        /// The prefix of problem `type` URIs (the code follows it); nil answers RFC 9457's
        /// `about:blank`.
        public var problemTypeBase: String?
        /// Headers set on every response of this server, its own 404s and 405s included (the
        /// console's CSP and cache rules, which must not depend on a route matching).
        public var responseHeaders: HTTPHeaders = [:]
        /// Renders every problem this server answers, its own 404s, 405s and 413s included; nil
        /// answers RFC 9457 problem+json. For a surface people read (the console's HTML pages).
        public var problemRenderer: (@Sendable (Problem, HTTPRequest) -> HTTPResponse)?

        public init() {}

        /// The most memory requests can hold at once: every connection with its full pool
        /// (request line, headers, response headers), a body at the limit, and what a request
        /// costs besides (its `HTTPRequest`, the answer, malloc's rounding). Measured with
        /// scripts/measure-body-memory.py: 1,024 connections each holding a 64 KiB body, by
        /// Content-Length or chunked, then all handled, peaked 115.7 MiB above the idle process
        /// (34 MiB), against 116 MiB here.
        public var memoryBoundBytes: Int { connectionLimit * (connectionMemoryBytes + maximumBodyBytes + 4 * 1024) }
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
    public func respond(to request: HTTPRequest) -> HTTPResponse { core.respond(to: request) }

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
                accept_policy: core.connectionCap == nil ? nil : serverAcceptPolicy,
                accept_policy_cls: core.connectionCap.map { Unmanaged.passUnretained($0).toOpaque() },
                handler: serverAccessHandler, handler_cls: context,
                completed: serverRequestCompleted, completed_cls: context,
                connection_notify: core.headerDeadline == nil && core.connectionCap == nil ? nil : serverConnectionNotify,
                connection_notify_cls: context,
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
            [
                ("address", configuration.listen), ("port", String(port)),
                ("memory_bound_mib", String(configuration.memoryBoundBytes >> 20)),
                (
                    "connections_per_address",
                    configuration.connectionsPerAddress == 0 ? "unlimited" : String(configuration.connectionsPerAddress)
                ),
            ])
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
    let inFlight = Atomic<Int>(0)
    let shuttingDown = Atomic<Bool>(false)
    let headerDeadline: HeaderDeadline?
    /// `connectionsPerAddress`, when set.
    let connectionCap: ConnectionCap?
    /// The server's own middleware around every exchange, a route's group middleware inside.
    let pipeline: [any HTTPMiddleware]

    init(
        configuration: HTTPServer.Configuration, router: Router, logger: Logger, metrics: MetricsRegistry,
        errorMapper: @escaping @Sendable (any Error) -> Problem?
    ) {
        self.configuration = configuration
        self.router = router
        self.logger = logger
        let client = ClientAddress(trusted: configuration.trustedProxies)
        connectionCap =
            configuration.connectionsPerAddress > 0
            ? ConnectionCap(limit: configuration.connectionsPerAddress, client: client) : nil
        var pipeline: [any HTTPMiddleware] = [
            RequestIDMiddleware(), ClientAddressMiddleware(client: client),
            SecurityHeadersMiddleware(
                strictTransportSecurity: configuration.tls != nil, responseHeaders: configuration.responseHeaders),
            MetricsMiddleware(metrics),
        ]
        if configuration.accessLog { pipeline.append(AccessLogMiddleware()) }
        pipeline.append(
            ProblemMiddleware(
                errorMapper: errorMapper, typeBase: configuration.problemTypeBase, renderer: configuration.problemRenderer))
        self.pipeline = pipeline
        let expired = metrics.counter(
            "http_header_timeouts_total", help: "Connections closed because a request's headers did not arrive in time.")
        headerDeadline =
            configuration.headerTimeoutSeconds > 0
            ? HeaderDeadline(seconds: configuration.headerTimeoutSeconds, expired: expired) : nil
    }

    /// Routes a complete request through the pipeline; `refusal` answers it without routing
    /// (a body over the limit). Never throws: the pipeline's innermost part makes errors problems.
    func respond(to request: HTTPRequest, refusal: Problem? = nil) -> HTTPResponse {
        var request = request
        let endpoint: HTTPHandler
        if let refusal {
            endpoint = { _ in throw refusal }
        } else if !HTTPMethod.known.contains(request.method) {
            endpoint = { _ in throw Problem.notImplemented }
        } else {
            switch router.match(request.method, request.path) {
            case .notFound:
                endpoint = { request in throw Problem.notFound(path: request.path) }
            case .methodNotAllowed(let allowed):
                endpoint = { request in throw Problem.methodNotAllowed(request.method, allowed: allowed) }
            case .found(let route, let parameters):
                request.pathParameters = parameters
                request.route = route.pattern
                endpoint = route.handler
            }
        }
        do {
            return try pipeline.wrapping(endpoint)(request)
        } catch {
            return Problem.internalError.response(instance: request.path, requestID: request.requestID)
        }
    }
}

/// Per-request state kept in libmicrohttpd's `con_cls` slot between callbacks.
final class RequestState {
    var body: [UInt8] = []
    /// Answered without routing (a body over the limit, ambiguous framing); the connection
    /// closes after the answer.
    var refusal: Problem?
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
        core.inFlight.add(1, ordering: .relaxed)
        if let ambiguous = RequestFraming.problem(pairs(connection, .HEADER_KIND)) {
            // Refused before any handler runs and before the body is read; the connection
            // closes after this response, so nothing after the head is taken for a request.
            state.refusal = .ambiguousFraming(ambiguous)
            return finish(core, connection, state, url: url, method: method)
        }
        let length = header(connection, "Content-Length").flatMap(Int.init)
        if let length, length > core.configuration.maximumBodyBytes {
            // Refuse before reading the body; the connection closes after this response.
            state.refusal = .payloadTooLarge(limit: core.configuration.maximumBodyBytes)
            return finish(core, connection, state, url: url, method: method)
        }
        // One allocation for an announced body: grown by appends it was copied as it doubled,
        // and the freed buffers, spread over the workers' malloc arenas, raised the peak.
        if let length, length > 0 { state.body.reserveCapacity(length) }
        return .YES
    }
    let state = Unmanaged<RequestState>.fromOpaque(existing).takeUnretainedValue()
    if uploadSize.pointee > 0 {
        if let uploadData {
            if state.body.count + uploadSize.pointee > core.configuration.maximumBodyBytes {
                // A chunked body past the limit (a Content-Length one was refused above). It is
                // not read on: the 413 goes out now and the connection closes.
                return refuseInMidBody(core, connection, state, url: url, method: method)
            }
            // A chunked body, unsized: room for the largest allowed at its first bytes, so it never
            // doubles past the limit (measured: doubling held 1,024 chunked bodies at 64 KiB in
            // 174 MiB above idle; sized, as in the memory bound: pool + limit per connection).
            if state.body.capacity == 0 { state.body.reserveCapacity(core.configuration.maximumBodyBytes) }
            uploadData.withMemoryRebound(to: UInt8.self, capacity: uploadSize.pointee) {
                state.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: uploadSize.pointee))
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
    // The deadline covers the head and the body: a body trickled a byte at a time is cut
    // off like slow headers, and its slot freed.
    core.headerDeadline?.headersArrived(connection)
    let methodName = HTTPMethod(method.map { String(cString: $0) } ?? "GET")
    let (query, repeated) = arguments(connection)
    var request = HTTPRequest(
        method: methodName, path: url.map { String(cString: $0) } ?? "/", query: query,
        headers: headers(connection), body: state.body, remoteAddress: clientAddress(connection), requestID: "",
        logger: core.logger)
    request.repeatedQueryNames = repeated
    request.received = state.started
    var response = core.respond(to: request, refusal: state.refusal)
    // A refused body is not read: the connection closes after the answer.
    if state.refusal != nil || core.shuttingDown.load(ordering: .relaxed) { response.headers.set("Connection", "close") }
    return queue(response, on: connection, omitBody: methodName == .head)
}

/// Answers 413 while the body is still arriving, and closes the connection. libmicrohttpd
/// 0.9.75 (to 1.0.1) queues no response in mid-body: MHD_queue_response wants the state
/// HEADERS_PROCESSED or FULL_REQ_RECEIVED and returns MHD_NO in between, and a body left
/// unconsumed gets its own 500 page. So the answer is written on the socket (or its TLS
/// session) here, on the connection's own thread with nothing else queued, and MHD_NO makes
/// libmicrohttpd close the connection (TCP or TLS shutdown, then close) and report the request
/// ended with an error. Were the write to fail, the connection still closes, unanswered.
private func refuseInMidBody(
    _ core: ServerCore, _ connection: OpaquePointer, _ state: RequestState,
    url: UnsafePointer<CChar>?, method: UnsafePointer<CChar>?
) -> MHD_Result {
    state.refusal = .payloadTooLarge(limit: core.configuration.maximumBodyBytes)
    state.body = []
    core.headerDeadline?.headersArrived(connection)
    let methodName = HTTPMethod(method.map { String(cString: $0) } ?? "POST")
    var request = HTTPRequest(
        method: methodName, path: url.map { String(cString: $0) } ?? "/", query: arguments(connection).query,
        headers: headers(connection), body: [], remoteAddress: clientAddress(connection), requestID: "",
        logger: core.logger)
    request.received = state.started
    let response = core.respond(to: request, refusal: .payloadTooLarge(limit: core.configuration.maximumBodyBytes))
    let bytes = serialized(response)
    _ = bytes.withUnsafeBytes { raw in
        cbroker_mhd_send_raw(connection, core.configuration.tls == nil ? 0 : 1, raw.baseAddress!, raw.count, 1000)
    }
    return .NO
}

/// An HTTP/1.1 response as libmicrohttpd would write it, with `Connection: close`.
private func serialized(_ response: HTTPResponse) -> [UInt8] {
    let reason = MHD_get_reason_phrase_for(UInt32(response.status)).map { String(cString: $0) } ?? ""
    var head = "HTTP/1.1 \(response.status) \(reason)\r\n"
    for (name, value) in response.headers
    where !["content-length", "connection", "date"].contains(name.lowercased()) {
        head += "\(name): \(value)\r\n"
    }
    head += "Date: \(httpDate())\r\nContent-Length: \(response.body.count)\r\nConnection: close\r\n\r\n"
    return Array(head.utf8) + response.body
}

/// RFC 9110's IMF-fixdate for the `Date` header.
private func httpDate() -> String {
    var now = time(nil)
    var parts = tm()
    gmtime_r(&now, &parts)
    var buffer = [CChar](repeating: 0, count: 64)
    let count = strftime(&buffer, buffer.count, "%a, %d %b %Y %H:%M:%S GMT", &parts)
    return String(decoding: buffer.prefix(count).map(UInt8.init(bitPattern:)), as: UTF8.self)
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

/// The query arguments (the first value of a name sent twice) and the names sent more than once.
private func arguments(_ connection: OpaquePointer) -> (query: [String: String], repeated: Set<String>) {
    var query: [String: String] = [:]
    var repeated: Set<String> = []
    for (key, value) in pairs(connection, .GET_ARGUMENT_KIND) {
        if query[key] == nil { query[key] = value } else { repeated.insert(key) }
    }
    return (query, repeated)
}

func clientAddress(_ connection: OpaquePointer) -> String {
    var buffer = [CChar](repeating: 0, count: 64)
    guard cbroker_mhd_client_address(connection, &buffer, buffer.count) == 0 else { return "" }
    return String(decoding: buffer.prefix { $0 != 0 }.map(UInt8.init(bitPattern:)), as: UTF8.self)
}
