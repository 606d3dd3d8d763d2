/// Handles one matched request.
public typealias HTTPHandler = @Sendable (HTTPRequest) throws -> HTTPResponse

/// Maps method + path pattern to a handler. Patterns are literal segments and `{name}`
/// parameters, e.g. `/v1/users/{id}/credential-state`. Build it at start-up; it is then
/// an immutable value shared by every worker thread without locks.
public struct Router: Sendable {
    /// One registered route.
    public struct Route: Sendable {
        public let method: HTTPMethod
        public let pattern: String
        let segments: [Segment]
        let handler: HTTPHandler
    }

    enum Segment: Sendable, Equatable {
        case literal(String)
        case parameter(String)
    }

    enum Match {
        case found(Route, [String: String])
        case methodNotAllowed([HTTPMethod])
        case notFound
    }

    public private(set) var routes: [Route] = []
    /// The middleware of the groups being registered, outermost first.
    private var middleware: [any HTTPMiddleware] = []

    public init() {}

    /// Registers the routes `body` adds behind `middleware` (outermost first), inside the
    /// middleware of any enclosing group: every route of the group gets the same pipeline.
    public mutating func group(_ middleware: any HTTPMiddleware..., routes body: (inout Router) -> Void) {
        let enclosing = self.middleware
        self.middleware += middleware
        defer { self.middleware = enclosing }
        body(&self)
    }

    /// Registers `handler` for `method` and `pattern`, behind the current group's middleware.
    public mutating func on(_ method: HTTPMethod, _ pattern: String, _ handler: @escaping HTTPHandler) {
        precondition(pattern.hasPrefix("/"), "route patterns start with /")
        let segments = Self.split(pattern).map { part -> Segment in
            if part.hasPrefix("{") && part.hasSuffix("}") { return .parameter(String(part.dropFirst().dropLast())) }
            return .literal(String(part))
        }
        precondition(
            !routes.contains { $0.method == method && $0.segments == segments }, "duplicate route \(method) \(pattern)")
        routes.append(Route(method: method, pattern: pattern, segments: segments, handler: middleware.wrapping(handler)))
    }

    public mutating func get(_ pattern: String, _ handler: @escaping HTTPHandler) { on(.get, pattern, handler) }
    public mutating func post(_ pattern: String, _ handler: @escaping HTTPHandler) { on(.post, pattern, handler) }
    public mutating func delete(_ pattern: String, _ handler: @escaping HTTPHandler) { on(.delete, pattern, handler) }
    public mutating func patch(_ pattern: String, _ handler: @escaping HTTPHandler) { on(.patch, pattern, handler) }

    func match(_ method: HTTPMethod, _ path: String) -> Match {
        let parts = Self.split(path)
        var allowed: [HTTPMethod] = []
        for route in routes {
            guard let parameters = Self.bind(route.segments, parts) else { continue }
            if route.method == method || (method == .head && route.method == .get) {
                return .found(route, parameters)
            }
            allowed.append(route.method)
        }
        if allowed.isEmpty { return .notFound }
        if allowed.contains(.get) && !allowed.contains(.head) { allowed.append(.head) }
        return .methodNotAllowed(allowed)
    }

    private static func split(_ path: String) -> [Substring] {
        path.split(separator: "/", omittingEmptySubsequences: false).dropFirst().map { $0 }
    }

    private static func bind(_ segments: [Segment], _ parts: [Substring]) -> [String: String]? {
        guard segments.count == parts.count else { return nil }
        var parameters: [String: String] = [:]
        for (segment, part) in zip(segments, parts) {
            switch segment {
            case .literal(let literal):
                guard literal == part else { return nil }
            case .parameter(let name):
                guard !part.isEmpty else { return nil }
                parameters[name] = String(part)
            }
        }
        return parameters
    }
}
