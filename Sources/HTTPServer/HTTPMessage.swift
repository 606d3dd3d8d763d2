import Foundation
import Observability

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
}

/// Header fields with case-insensitive lookup, in arrival order.
public struct HTTPHeaders: Sendable, Sequence, ExpressibleByDictionaryLiteral {
    private var fields: [(name: String, value: String)]

    public init(_ fields: [(String, String)] = []) {
        self.fields = fields.map { (name: $0.0, value: $0.1) }
    }

    public init(dictionaryLiteral elements: (String, String)...) { self.init(elements) }

    /// The first value of `name`, ignoring case.
    public subscript(_ name: String) -> String? {
        fields.first { $0.name.caseInsensitiveCompare(name) == .orderedSame }?.value
    }

    public mutating func add(_ name: String, _ value: String) { fields.append((name, value)) }

    /// Replaces every value of `name` with `value`.
    public mutating func set(_ name: String, _ value: String) {
        fields.removeAll { $0.name.caseInsensitiveCompare(name) == .orderedSame }
        fields.append((name, value))
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
    public let headers: HTTPHeaders
    public let body: [UInt8]
    /// The peer's IP address.
    public let remoteAddress: String
    /// The id of this request, echoed in `X-Request-Id` and in every problem and log line.
    public let requestID: String
    /// `{name}` segments of the route pattern that matched.
    public internal(set) var pathParameters: [String: String] = [:]
    /// The route pattern that matched, e.g. `/v1/users/{id}`.
    public internal(set) var route: String = ""
    /// A logger carrying the request id.
    public let logger: Logger

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
        self.requestID = requestID
        self.logger = logger
    }

    /// The value of a path parameter; throws 404 if the route has none by that name.
    public func parameter(_ name: String) throws -> String {
        guard let value = pathParameters[name] else { throw Problem.notFound(path: path) }
        return value
    }

    /// The bearer token of `Authorization: Bearer …`, if present.
    public var bearerToken: String? {
        guard let value = headers["Authorization"] else { return nil }
        let parts = value.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].caseInsensitiveCompare("Bearer") == .orderedSame else { return nil }
        let token = parts[1].trimmingCharacters(in: .whitespaces)
        return token.isEmpty ? nil : token
    }

    /// Decodes a JSON body into `T`.
    /// - Throws: 415 `unsupported_media_type` unless `Content-Type` is JSON; 400 `invalid_json`
    ///   for a body that is not JSON; 400 `invalid_request` naming the field that is missing or
    ///   of the wrong type.
    public func decodeJSON<T: Decodable>(_ type: T.Type) throws -> T {
        let contentType = headers["Content-Type"]?.split(separator: ";").first?
            .trimmingCharacters(in: .whitespaces).lowercased()
        guard contentType == "application/json" || contentType?.hasSuffix("+json") == true else {
            throw Problem(
                status: 415, code: "unsupported_media_type", title: "Unsupported media type",
                detail: "send the body as application/json")
        }
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

    /// A plain-text body.
    public static func text(_ text: String, status: Int = 200, contentType: String = "text/plain; charset=utf-8")
        -> HTTPResponse
    {
        HTTPResponse(status: status, headers: ["Content-Type": contentType], body: Array(text.utf8))
    }

    /// 204 No Content.
    public static var noContent: HTTPResponse { HTTPResponse(status: 204) }
}
