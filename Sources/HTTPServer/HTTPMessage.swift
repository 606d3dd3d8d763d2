import Foundation
import Observability
import StrictJSON

/// An HTTP method, compared case-sensitively as RFC 9110 says.
public struct HTTPMethod: Hashable, Sendable, CustomStringConvertible, ExpressibleByStringLiteral {
    public let rawValue: String
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public init(stringLiteral value: String) { self.rawValue = value }
    public var description: String { rawValue }

    public static let get: HTTPMethod = "GET"
    public static let head: HTTPMethod = "HEAD"
    public static let post: HTTPMethod = "POST"
    public static let put: HTTPMethod = "PUT"
    public static let patch: HTTPMethod = "PATCH"
    public static let delete: HTTPMethod = "DELETE"
    public static let options: HTTPMethod = "OPTIONS"
    public static let trace: HTTPMethod = "TRACE"
    public static let connect: HTTPMethod = "CONNECT"
    /// The IETF's safe method with a body (draft-ietf-httpbis-safe-method-w-body).
    public static let query: HTTPMethod = "QUERY"

    /// The methods the server knows: RFC 9110's, PATCH and QUERY. A known method a route does not
    /// take is 405 with `Allow`; anything else is 501 and labelled `other`: a method is
    /// whatever token a client sends (up to the header size), so it must never become a
    /// metric label or a log field as it is.
    public static let known: Set<HTTPMethod> = [.get, .head, .post, .put, .patch, .delete, .options, .trace, .connect, .query]

    /// The method as a bounded label: its name when known, else `other`.
    public var label: String { Self.known.contains(self) ? rawValue : "other" }
}

/// Header fields with case-insensitive lookup, in arrival order.
public struct HTTPHeaders: Sendable, Sequence, ExpressibleByDictionaryLiteral {
    private var fields: [(name: String, value: String)]

    public init(_ fields: [(String, String)] = []) {
        self.fields = fields.map { (name: $0.0, value: $0.1) }
    }

    public init(dictionaryLiteral elements: (String, String)...) { self.init(elements) }

    /// The first value of `name`, ignoring ASCII case (field names are ASCII, RFC 9110 §5.1).
    public subscript(_ name: String) -> String? {
        fields.first { Self.sameName($0.name, name) }?.value
    }

    /// Every value of `name`, in arrival order.
    public func values(_ name: String) -> [String] { fields.filter { Self.sameName($0.name, name) }.map(\.value) }

    public mutating func add(_ name: String, _ value: String) { fields.append((name, value)) }

    /// Replaces every value of `name` with `value`.
    public mutating func set(_ name: String, _ value: String) {
        fields.removeAll { Self.sameName($0.name, name) }
        fields.append((name, value))
    }

    /// ASCII case-insensitive equality, without Foundation's Unicode machinery (hot path).
    static func sameName(_ lhs: String, _ rhs: String) -> Bool {
        var lhs = lhs.utf8.makeIterator()
        var rhs = rhs.utf8.makeIterator()
        while true {
            switch (lhs.next(), rhs.next()) {
            case (nil, nil): return true
            case (let a?, let b?):
                if a == b { continue }
                if a | 0x20 != b | 0x20 || !((a | 0x20) >= 0x61 && (a | 0x20) <= 0x7A) { return false }
            default: return false
            }
        }
    }

    public func makeIterator() -> IndexingIterator<[(name: String, value: String)]> { fields.makeIterator() }
}

/// A request as handlers see it: complete, with the body read and path parameters matched.
public struct HTTPRequest: Sendable {
    public let method: HTTPMethod
    /// The path, percent-decoded, without the query string.
    public let path: String
    /// Query arguments, percent-decoded; a bare `?flag` has the value "".
    public let query: [String: String]
    /// Query names sent more than once (`query` holds the first value): for protocols that
    /// refuse a repeated parameter rather than guess (RFC 6749 §3.1).
    public internal(set) var repeatedQueryNames: Set<String> = []
    public let headers: HTTPHeaders
    public let body: [UInt8]
    /// The client's IP address: the peer's, or behind trusted proxies the right-most
    /// untrusted address of `X-Forwarded-For` (`ClientAddress`). Budgets and logs use it.
    public internal(set) var remoteAddress: String
    /// The address of the socket's other end (a proxy's, behind one).
    public let peerAddress: String
    /// The id of this request, echoed in `X-Request-Id` and in every problem and log line.
    public internal(set) var requestID: String
    /// `{name}` segments of the route pattern that matched.
    public internal(set) var pathParameters: [String: String] = [:]
    /// The route pattern that matched, e.g. `/v1/users/{id}`.
    public internal(set) var route: String = ""
    /// A logger carrying the request id.
    public internal(set) var logger: Logger
    /// What middleware established for the handlers after it (Hummingbird's request
    /// context), e.g. the API key that authenticated the request.
    public var identity: (any Sendable)?
    /// When the headers arrived (latency is counted from here).
    var received: ContinuousClock.Instant

    public init(
        method: HTTPMethod, path: String, query: [String: String] = [:], headers: HTTPHeaders = [:],
        body: [UInt8] = [], remoteAddress: String = "127.0.0.1", requestID: String = UUID().uuidString,
        logger: Logger = Logger(label: "http")
    ) {
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.remoteAddress = remoteAddress
        peerAddress = remoteAddress
        self.requestID = requestID
        self.logger = logger
        identity = nil
        received = .now
    }

    /// The value of a path parameter; throws 404 if the route has none by that name.
    public func parameter(_ name: String) throws -> String {
        guard let value = pathParameters[name] else { throw Problem.notFound(path: path) }
        return value
    }

    /// The bearer token of `Authorization: Bearer …`, if present.
    public var bearerToken: String? {
        guard let value = headers["Authorization"] else { return nil }
        let utf8 = Array(value.utf8)
        guard utf8.count > 7, HTTPHeaders.sameName(String(decoding: utf8[0..<6], as: UTF8.self), "Bearer"),
            utf8[6] == UInt8(ascii: " ")
        else { return nil }
        var token = utf8[7...]
        while let first = token.first, first == UInt8(ascii: " ") || first == UInt8(ascii: "\t") { token.removeFirst() }
        while let last = token.last, last == UInt8(ascii: " ") || last == UInt8(ascii: "\t") { token.removeLast() }
        return token.isEmpty ? nil : String(decoding: token, as: UTF8.self)
    }

    /// The body as a JSON object, read strictly (duplicate member names are refused).
    /// - Throws: 415 `unsupported_media_type`, 400 `invalid_json` (also for a non-object).
    /// - Parameter anyContentType: read the body as JSON whatever its `Content-Type` says
    ///   (Apple's notifications: their content type is not documented, the JWS is the proof).
    public func jsonObject(anyContentType: Bool = false) throws -> JSONObjectReader {
        if !anyContentType { try requireJSONContentType() }
        guard !body.isEmpty else {
            throw Problem(status: 400, code: "invalid_json", title: "Invalid JSON body", detail: "the body is empty")
        }
        do {
            return JSONObjectReader(members: try JSONValue.parseObject(body), path: "")
        } catch let error as JSONParseError {
            throw Problem(status: 400, code: "invalid_json", title: "Invalid JSON body", detail: error.reason)
        }
    }

    /// True when the client is a browser asking for a page: its `Accept` names `text/html`
    /// (browsers send it on navigations; API clients and curl do not).
    public var prefersHTML: Bool {
        headers["Accept"]?.lowercased().contains("text/html") ?? false
    }

    /// The `Content-Type` without its parameters, lowercased (`application/json`).
    public var mediaType: String? {
        headers["Content-Type"].map { $0.split(separator: ";", maxSplits: 1).first.map(String.init) ?? "" }
            .map { $0.lowercased().filter { $0 != " " } }
    }

    private func requireJSONContentType() throws {
        guard let mediaType, mediaType == "application/json" || mediaType.hasSuffix("+json") else {
            throw Self.unsupportedMediaType
        }
    }

    private static let unsupportedMediaType = Problem(
        status: 415, code: "unsupported_media_type", title: "Unsupported media type",
        detail: "send the body as application/json")

    /// Decodes a JSON body into `T`.
    /// - Throws: 415 `unsupported_media_type` unless `Content-Type` is JSON; 400 `invalid_json`
    ///   for a body that is not JSON; 400 `invalid_request` naming the field that is missing or
    ///   of the wrong type.
    public func decodeJSON<T: Decodable>(_ type: T.Type) throws -> T {
        try requireJSONContentType()
        guard !body.isEmpty else {
            throw Problem(status: 400, code: "invalid_json", title: "Invalid JSON body", detail: "the body is empty")
        }
        do {
            return try JSONDecoder().decode(T.self, from: Data(body))
        } catch let error as DecodingError {
            throw Problem.from(error)
        } catch let problem as Problem {
            throw problem
        } catch {
            throw Problem(status: 400, code: "invalid_json", title: "Invalid JSON body", detail: "the body is not JSON")
        }
    }
}

/// A response: status, headers and a body that is sent as is.
public struct HTTPResponse: Sendable {
    public var status: Int
    public var headers: HTTPHeaders
    public var body: [UInt8]

    public init(status: Int, headers: HTTPHeaders = [:], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A JSON body encoded from `value`.
    public static func json(_ value: some Encodable, status: Int = 200, headers: HTTPHeaders = [:]) -> HTTPResponse {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        var headers = headers
        headers.set("Content-Type", "application/json")
        do {
            return HTTPResponse(status: status, headers: headers, body: Array(try encoder.encode(value)))
        } catch {
            return Problem.internalError.response(instance: "", requestID: "")
        }
    }

    /// A JSON body from a `JSONValue` (the fast path: no `JSONEncoder`).
    public static func json(_ value: JSONValue, status: Int = 200, headers: HTTPHeaders = [:]) -> HTTPResponse {
        var headers = headers
        headers.set("Content-Type", "application/json")
        return HTTPResponse(status: status, headers: headers, body: value.serialized())
    }

    /// A plain-text body.
    public static func text(_ text: String, status: Int = 200, contentType: String = "text/plain; charset=utf-8")
        -> HTTPResponse
    {
        HTTPResponse(status: status, headers: ["Content-Type": contentType], body: Array(text.utf8))
    }

    /// 204 No Content.
    public static var noContent: HTTPResponse { HTTPResponse(status: 204) }
}
