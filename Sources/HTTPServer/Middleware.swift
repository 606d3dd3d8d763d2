import Foundation
import Observability
import StrictJSON
import Synchronization

/// A handler wrapping a handler (Hummingbird's `RouterMiddleware` shape): it may look at or
/// change the request, answer by itself, call `next`, and look at or change the response.
/// The server runs its own chain (request id, client address, security headers, metrics,
/// access log, problems) around every exchange; a route group adds its own (API keys,
/// budgets, browser pages) around its routes, so every route of a group gets one pipeline.
public protocol HTTPMiddleware: Sendable {
    func handle(_ request: HTTPRequest, next: HTTPHandler) throws -> HTTPResponse
}

extension Array where Element == any HTTPMiddleware {
    /// `endpoint` behind these middleware, the first outermost.
    public func wrapping(_ endpoint: @escaping HTTPHandler) -> HTTPHandler {
        reversed().reduce(endpoint) { next, middleware in
            { request in try middleware.handle(request, next: next) }
        }
    }
}

/// Refuses a client address (IPv6 by /64) over its budget with 429 and `Retry-After`.
public struct AddressBudget: HTTPMiddleware {
    /// What a request costs.
    public enum Charge: Sendable {
        /// Every request takes a token, before it runs.
        case everyRequest
        /// Only a refused request (a 4xx) takes one, after it ran: what succeeds is never
        /// refused for a budget that failures used up (Apple's signed notifications, whose
        /// signature is the proof, beside unauthenticated junk from the same address).
        case failures
    }

    let limiter: RateLimiter
    let charge: Charge

    public init(_ limiter: RateLimiter, charge: Charge = .everyRequest) {
        self.limiter = limiter
        self.charge = charge
    }

    public func handle(_ request: HTTPRequest, next: HTTPHandler) throws -> HTTPResponse {
        switch charge {
        case .everyRequest:
            try limiter.check(address: request.remoteAddress)
            return try next(request)
        case .failures:
            let response: HTTPResponse
            do {
                response = try next(request)
            } catch let problem as Problem where (400..<500).contains(problem.status) {
                try limiter.check(address: request.remoteAddress)
                throw problem
            }
            if (400..<500).contains(response.status) { try limiter.check(address: request.remoteAddress) }
            return response
        }
    }
}

// MARK: - The server's own chain

/// Names the request (`X-Request-Id`): the caller's when it is a sane token, otherwise a
/// fresh one; every log line of the request carries it, and so does the response.
final class RequestIDMiddleware: HTTPMiddleware {
    let counter = Atomic<Int>(0)
    /// A random per-process prefix and a counter: unique, and no syscall per request
    /// (Foundation's UUID() opens /dev/urandom every time).
    let prefix = String(UInt64.random(in: 1...UInt64.max), radix: 36)

    func handle(_ request: HTTPRequest, next: HTTPHandler) throws -> HTTPResponse {
        var request = request
        request.requestID = requestID(from: request.headers["X-Request-Id"])
        request.logger = request.logger.with(("request_id", request.requestID))
        var response = try next(request)
        response.headers.set("X-Request-Id", request.requestID)
        return response
    }

    func requestID(from header: String?) -> String {
        if let header, (1...64).contains(header.utf8.count),
            header.utf8.allSatisfy({
                $0.isASCIIAlphanumeric || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: ".")
            })
        {
            return header
        }
        return prefix + "-" + String(counter.add(1, ordering: .relaxed).newValue, radix: 16)
    }
}

/// The client behind trusted proxies (`ClientAddress`): budgets and log lines see it.
struct ClientAddressMiddleware: HTTPMiddleware {
    let client: ClientAddress

    func handle(_ request: HTTPRequest, next: HTTPHandler) throws -> HTTPResponse {
        var request = request
        request.remoteAddress = client.resolve(peer: request.peerAddress, forwardedFor: request.headers.values("X-Forwarded-For"))
        return try next(request)
    }
}

/// Nothing is sniffed into another type; HTTPS only from now on when we terminate TLS; and
/// the server's own headers (`HTTPServer.Configuration.responseHeaders`) on every response.
struct SecurityHeadersMiddleware: HTTPMiddleware {
    let strictTransportSecurity: Bool
    var responseHeaders: HTTPHeaders = [:]

    func handle(_ request: HTTPRequest, next: HTTPHandler) throws -> HTTPResponse {
        var response = try next(request)
        response.headers.set("X-Content-Type-Options", "nosniff")
        if strictTransportSecurity { response.headers.set("Strict-Transport-Security", "max-age=31536000") }
        for (name, value) in responseHeaders { response.headers.set(name, value) }
        return response
    }
}

/// Request counts and latency by route, method and status (from when the headers arrived).
struct MetricsMiddleware: HTTPMiddleware {
    let requestCount: CounterFamily
    let requestDuration: HistogramFamily

    init(_ metrics: MetricsRegistry) {
        requestCount = metrics.counter(
            "http_requests_total", help: "HTTP requests by route, method and status.", labels: ["route", "method", "status"])
        requestDuration = metrics.histogram(
            "http_request_duration_seconds", help: "HTTP request latency by route and method.", labels: ["route", "method"])
    }

    func handle(_ request: HTTPRequest, next: HTTPHandler) throws -> HTTPResponse {
        let response = try next(request)
        requestCount.increment(request.routeLabel, request.method.label, String(response.status))
        requestDuration.observe(request.secondsSinceReceived, request.routeLabel, request.method.label)
        return response
    }
}

/// One `info` line per request: method, route, status, duration and the client address.
struct AccessLogMiddleware: HTTPMiddleware {
    func handle(_ request: HTTPRequest, next: HTTPHandler) throws -> HTTPResponse {
        let response = try next(request)
        let method = request.method
        // An invented method is logged as `other` plus its first 32 bytes, never whole.
        let logged =
            method.label == "other"
            ? "other:" + String(decoding: method.rawValue.utf8.prefix(32), as: UTF8.self) : method.rawValue
        request.logger.info(
            "request",
            [
                ("method", logged), ("route", request.routeLabel), ("status", String(response.status)),
                ("duration_ms", String(format: "%.2f", request.secondsSinceReceived * 1000)), ("client", request.remoteAddress),
            ])
        return response
    }
}

/// The innermost of the server's chain: whatever a route or its middleware throws becomes
/// an RFC 9457 response. A `Problem` as it is, a JSON field error 400, anything else what
/// the error mapper makes of it or, when it knows nothing of it, 500 (logged).
struct ProblemMiddleware: HTTPMiddleware {
    let errorMapper: @Sendable (any Error) -> Problem?
    let typeBase: String?
    var renderer: (@Sendable (Problem, HTTPRequest) -> HTTPResponse)? = nil

    func handle(_ request: HTTPRequest, next: HTTPHandler) throws -> HTTPResponse {
        do {
            return try next(request)
        } catch {
            let problem = problem(for: error, request: request)
            if let renderer { return renderer(problem, request) }
            return problem.response(instance: request.path, requestID: request.requestID, typeBase: typeBase)
        }
    }

    private func problem(for error: any Error, request: HTTPRequest) -> Problem {
        switch error {
        case let problem as Problem:
            return problem
        case let error as JSONFieldError:
            return .badRequest(error.detail)
        default:
            if let problem = errorMapper(error) {
                if problem.status >= 500 {
                    request.logger.warning("request failed", [("route", request.routeLabel), ("error", "\(error)")])
                }
                return problem
            }
            request.logger.error(
                "unhandled error", [("route", request.routeLabel), ("error_type", "\(type(of: error))"), ("error", "\(error)")])
            return .internalError
        }
    }
}

extension HTTPRequest {
    /// The route for metrics and logs; `unmatched` for 404, 405, 413 and 501.
    var routeLabel: String { route.isEmpty ? "unmatched" : route }

    var secondsSinceReceived: Double {
        let elapsed = ContinuousClock.now - received
        return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    }
}

extension UInt8 {
    fileprivate var isASCIIAlphanumeric: Bool {
        (48...57).contains(self) || (65...90).contains(self) || (97...122).contains(self)
    }
}
