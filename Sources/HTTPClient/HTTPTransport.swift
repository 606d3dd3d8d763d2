/// An outbound HTTP request.
public struct HTTPClientRequest: Sendable {
    public var method: String
    public var url: String
    public var headers: [(String, String)]
    public var body: [UInt8]
    /// Whole-exchange limit, connection included.
    public var timeout: Duration
    /// Connect only to these addresses for the URL's host (checked before, so that a second
    /// lookup cannot answer differently: DNS rebinding); nil resolves as usual.
    public var pinnedAddresses: [String]?

    public init(
        method: String = "GET", url: String, headers: [(String, String)] = [], body: [UInt8] = [],
        timeout: Duration = .seconds(10)
    ) {
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.timeout = timeout
    }

    /// A `POST` with an `application/x-www-form-urlencoded` body (what Apple's endpoints take).
    public static func form(
        url: String, fields: [(String, String)], headers: [(String, String)] = [], timeout: Duration = .seconds(10)
    ) -> HTTPClientRequest {
        HTTPClientRequest(
            method: "POST", url: url, headers: headers + [("Content-Type", "application/x-www-form-urlencoded")],
            body: Array(FormEncoding.encode(fields).utf8), timeout: timeout)
    }
}

/// An HTTP response; header names are lowercased.
public struct HTTPClientResponse: Sendable {
    public var status: Int
    public var headers: [(String, String)]
    public var body: [UInt8]

    public init(status: Int, headers: [(String, String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// The first value of a header, ignoring case.
    public func header(_ name: String) -> String? {
        let lowered = name.lowercased()
        return headers.first { $0.0 == lowered }?.1
    }

    public var bodyText: String { String(decoding: body, as: UTF8.self) }
}

/// Why an exchange produced no HTTP response.
public struct HTTPClientError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        init(_ name: String) { self.name = name }
        public var description: String { name }

        public static let timeout = Code("timeout")
        public static let connectionFailed = Code("connection_failed")
        /// The peer closed the connection or reset it mid-exchange.
        public static let connectionClosed = Code("connection_closed")
        public static let responseTooLarge = Code("response_too_large")
        public static let invalidURL = Code("invalid_url")
        public static let other = Code("transport_error")
    }

    public let code: Code
    public let detail: String

    public init(_ code: Code, _ detail: String) {
        self.code = code
        self.detail = detail
    }

    public var description: String { "HTTPClientError.\(code): \(detail)" }
}

/// Sends HTTP requests, blocking the calling thread until the response or an error.
///
/// The seam for everything that talks to Apple or to webhook receivers: production uses
/// `CurlTransport`; tests may substitute one that fails on purpose.
public protocol HTTPTransport: Sendable {
    func send(_ request: HTTPClientRequest) throws -> HTTPClientResponse
}

/// `application/x-www-form-urlencoded` (WHATWG URL standard §5).
public enum FormEncoding {
    public static func encode(_ fields: [(String, String)]) -> String {
        fields.map { escape($0.0) + "=" + escape($0.1) }.joined(separator: "&")
    }

    public static func escape(_ text: String) -> String {
        var output = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "*"):
                output.unicodeScalars.append(Unicode.Scalar(byte))
            case UInt8(ascii: " "):
                output += "+"
            default:
                output += "%" + String(byte >> 4, radix: 16, uppercase: true) + String(byte & 0xF, radix: 16, uppercase: true)
            }
        }
        return output
    }

    /// A form body's fields by name; of a repeated name, the first value counts.
    public static func fields(_ text: String) -> [String: String] {
        var fields: [String: String] = [:]
        for (name, value) in decode(text) where fields[name] == nil { fields[name] = value }
        return fields
    }

    /// Parses a form body; `+` is a space. Malformed escapes are kept literally.
    public static func decode(_ text: String) -> [(String, String)] {
        text.split(separator: "&", omittingEmptySubsequences: true).map { pair in
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            return (unescape(parts[0]), parts.count > 1 ? unescape(parts[1]) : "")
        }
    }

    static func unescape(_ text: Substring) -> String {
        var bytes: [UInt8] = []
        var iterator = Array(text.utf8).makeIterator()
        while let byte = iterator.next() {
            switch byte {
            case UInt8(ascii: "+"): bytes.append(UInt8(ascii: " "))
            case UInt8(ascii: "%"):
                let high = iterator.next()
                let low = iterator.next()
                if let high, let low, let value = UInt8(String(decoding: [high, low], as: UTF8.self), radix: 16) {
                    bytes.append(value)
                } else {
                    bytes.append(byte)
                    if let high { bytes.append(high) }
                    if let low { bytes.append(low) }
                }
            default: bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
