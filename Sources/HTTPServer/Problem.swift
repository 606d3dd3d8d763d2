import Foundation
import StrictJSON

/// An RFC 9457 problem: the error every endpoint answers with, as
/// `application/problem+json`, carrying a stable machine-readable `code`.
///
/// Throw it from a handler; any other error becomes a 500 `internal_error` (or what the
/// server's error mapper makes of it) and is logged without its details reaching the client.
public struct Problem: Error, Sendable, Equatable, CustomStringConvertible {
    public var status: Int
    /// Stable, documented code, e.g. `token_expired`. Clients switch on this.
    public var code: String
    /// Short human summary of the problem type.
    public var title: String
    /// Human explanation of this occurrence. Never holds secrets or personal data.
    public var detail: String?
    /// Extra response headers (`Allow`, `Retry-After`, `WWW-Authenticate`).
    public var headers: [String: String]
    /// Extra members of the problem object (string values).
    public var extensions: [String: String]

    public init(
        status: Int, code: String, title: String, detail: String? = nil,
        headers: [String: String] = [:], extensions: [String: String] = [:]
    ) {
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.headers = headers
        self.extensions = extensions
    }

    public var description: String { "Problem(\(status) \(code))" }

    /// Every `code` the server itself answers with (routing, bodies, limits); the
    /// application's handlers add their own.
    public static let serverCodes: Set<String> = [
        "not_found", "method_not_allowed", "not_implemented", "payload_too_large", "ambiguous_framing", "unsupported_media_type",
        "invalid_json", "invalid_request", "rate_limited", "internal_error",
    ]

    /// The problem as an HTTP response.
    /// - Parameter typeBase: the application's problem type URIs: `type` is this followed
    ///   by the code (`urn:example:problem:` + `not_found`); nil is RFC 9457's `about:blank`.
    public func response(instance: String, requestID: String, typeBase: String? = nil) -> HTTPResponse {
        var object = extensions.mapValues(JSONValue.string)
        object["type"] = .string(typeBase.map { $0 + code } ?? "about:blank")
        object["title"] = .string(title)
        object["code"] = .string(code)
        object["status"] = .integer(Int64(status))
        if let detail { object["detail"] = .string(detail) }
        if !instance.isEmpty { object["instance"] = .string(instance) }
        if !requestID.isEmpty { object["request_id"] = .string(requestID) }
        var responseHeaders = HTTPHeaders([("Content-Type", "application/problem+json")])
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) { responseHeaders.add(name, value) }
        return HTTPResponse(status: status, headers: responseHeaders, body: JSONValue.object(object).serialized())
    }
}

extension Problem {
    public static func notFound(path: String) -> Problem {
        Problem(status: 404, code: "not_found", title: "Not found", detail: "no resource at \(path)")
    }

    /// A method the server does not implement (anything but RFC 9110's methods and PATCH).
    /// The method is not echoed.
    public static let notImplemented = Problem(
        status: 501, code: "not_implemented", title: "Not implemented", detail: "the request method is not implemented")

    public static func methodNotAllowed(_ method: HTTPMethod, allowed: [HTTPMethod]) -> Problem {
        Problem(
            status: 405, code: "method_not_allowed", title: "Method not allowed",
            detail: "\(method) is not allowed here",
            headers: ["Allow": allowed.map(\.rawValue).joined(separator: ", ")])
    }

    public static func payloadTooLarge(limit: Int) -> Problem {
        Problem(
            status: 413, code: "payload_too_large", title: "Payload too large",
            detail: "the body exceeds \(limit) bytes")
    }

    public static let internalError = Problem(
        status: 500, code: "internal_error", title: "Internal server error",
        detail: "the server failed to handle the request; it has been logged")

    /// 503 with `Retry-After`, for a dependency that is down (the database, Apple).
    public static func unavailable(code: String, detail: String, retryAfterSeconds: Int = 5) -> Problem {
        Problem(
            status: 503, code: code, title: "Service unavailable", detail: detail,
            headers: ["Retry-After": String(retryAfterSeconds)])
    }

    public static func badRequest(code: String = "invalid_request", _ detail: String) -> Problem {
        Problem(status: 400, code: code, title: "Invalid request", detail: detail)
    }

    /// Maps a JSON decoding failure to a problem that names the offending field.
    static func from(_ error: DecodingError) -> Problem {
        func path(_ codingPath: [any CodingKey]) -> String {
            codingPath.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
        }
        switch error {
        case .keyNotFound(let key, let context):
            let field = path(context.codingPath + [key])
            return .badRequest("field `\(field)` is required")
        case .typeMismatch(let type, let context), .valueNotFound(let type, let context):
            let field = path(context.codingPath)
            return .badRequest("field `\(field)` must be \(Self.jsonTypeName(type))")
        case .dataCorrupted(let context):
            if context.codingPath.isEmpty {
                return Problem(
                    status: 400, code: "invalid_json", title: "Invalid JSON body", detail: "the body is not valid JSON")
            }
            return .badRequest("field `\(path(context.codingPath))` is invalid")
        @unknown default:
            return Problem(status: 400, code: "invalid_json", title: "Invalid JSON body", detail: "the body is not valid JSON")
        }
    }

    private static func jsonTypeName(_ type: Any.Type) -> String {
        switch type {
        case is String.Type: "a string"
        case is Bool.Type: "a boolean"
        case is Int.Type, is Int64.Type, is Double.Type: "a number"
        default: "of another type"
        }
    }
}
