import Foundation

/// SQL text with `$n` placeholders and the values bound to them.
///
/// Build queries by string interpolation: every interpolated value becomes a bind
/// parameter, never SQL text, so injection is impossible by construction:
///
/// ```swift
/// let rows = try connection.query("SELECT id FROM users WHERE id = \(userID) AND status = \(status)")
/// ```
///
/// Identifiers that must be spliced in (rare; constants only) use `\(unescaped: "name")`.
public struct PostgresQuery: Sendable, ExpressibleByStringInterpolation {
    public var sql: String
    public var binds: [PostgresBind]

    /// SQL written by hand with explicit `$n` placeholders.
    public init(unsafeSQL sql: String, binds: [PostgresBind] = []) {
        self.sql = sql
        self.binds = binds
    }

    public init(stringLiteral value: String) {
        self.init(unsafeSQL: value)
    }

    public init(stringInterpolation: StringInterpolation) {
        self.init(unsafeSQL: stringInterpolation.sql, binds: stringInterpolation.binds)
    }

    public struct StringInterpolation: StringInterpolationProtocol {
        var sql = ""
        var binds: [PostgresBind] = []

        public init(literalCapacity: Int, interpolationCount: Int) {
            sql.reserveCapacity(literalCapacity + interpolationCount * 3)
            binds.reserveCapacity(interpolationCount)
        }

        public mutating func appendLiteral(_ literal: String) { sql += literal }

        /// A value, sent as a bind parameter.
        public mutating func appendInterpolation(_ value: some PostgresEncodable) {
            binds.append(value.postgresBind)
            sql += "$\(binds.count)"
        }

        /// An optional value; `nil` binds SQL NULL.
        public mutating func appendInterpolation(_ value: (some PostgresEncodable)?) {
            binds.append(value?.postgresBind ?? .null)
            sql += "$\(binds.count)"
        }

        /// SQL text spliced in verbatim. Only for constants written in code, never input.
        public mutating func appendInterpolation(unescaped text: String) { sql += text }
    }
}

/// One bind parameter as libpq sends it.
public enum PostgresBind: Sendable, Equatable {
    case null
    /// Text format; the server parses it as the parameter's inferred type.
    case text(String)
    /// Binary format, used for `bytea`.
    case bytes([UInt8])
}

/// A Swift value that can be bound as a query parameter.
public protocol PostgresEncodable: Sendable {
    var postgresBind: PostgresBind { get }
}

extension String: PostgresEncodable {
    public var postgresBind: PostgresBind { .text(self) }
}
extension Substring: PostgresEncodable {
    public var postgresBind: PostgresBind { .text(String(self)) }
}
extension Int: PostgresEncodable {
    public var postgresBind: PostgresBind { .text(String(self)) }
}
extension Int64: PostgresEncodable {
    public var postgresBind: PostgresBind { .text(String(self)) }
}
extension Int32: PostgresEncodable {
    public var postgresBind: PostgresBind { .text(String(self)) }
}
extension Int16: PostgresEncodable {
    public var postgresBind: PostgresBind { .text(String(self)) }
}
extension Double: PostgresEncodable {
    public var postgresBind: PostgresBind { .text(String(self)) }
}
extension Bool: PostgresEncodable {
    public var postgresBind: PostgresBind { .text(self ? "t" : "f") }
}
extension UUID: PostgresEncodable {
    public var postgresBind: PostgresBind { .text(lowercasedString) }
}
extension Date: PostgresEncodable {
    public var postgresBind: PostgresBind { .text(PostgresTimestamp.format(self)) }
}
extension Duration: PostgresEncodable {
    /// An `interval` in whole microseconds (PostgreSQL's resolution): `\(lease)::interval`.
    public var postgresBind: PostgresBind {
        let (seconds, attoseconds) = components
        return .text("\(seconds * 1_000_000 + attoseconds / 1_000_000_000_000) microseconds")
    }
}
extension Array: PostgresEncodable where Element == UInt8 {
    public var postgresBind: PostgresBind { .bytes(self) }
}
extension Data: PostgresEncodable {
    public var postgresBind: PostgresBind { .bytes(Array(self)) }
}

/// Strings bound to a `text[]` parameter (in PostgreSQL's array literal form, every element
/// quoted so commas, braces, quotes and backslashes in values stay inside their element).
public struct PostgresTextArray: PostgresEncodable, Hashable {
    public var elements: [String]

    public init(_ elements: [String]) { self.elements = elements }

    /// Values of another type, each as its text bind (a `UUID` canonical, a `Date` as
    /// `timestamptz` text, a `Bool` as `t`/`f`): cast the array in SQL, `\(array)::uuid[]`.
    public init<Value: PostgresEncodable>(binding values: [Value]) {
        elements = values.map { value in
            guard case .text(let text) = value.postgresBind else {
                preconditionFailure("\(Value.self) binds no text: it cannot be an element of a text array")
            }
            return text
        }
    }

    public var postgresBind: PostgresBind {
        let quoted = elements.map { element in
            // Foundation's replacingOccurrences costs even when nothing matches (1% of a batched
            // sign-in's CPU, for UUIDs and timestamps): only strings holding `\` or `"` go through it.
            guard element.utf8.contains(where: { $0 == UInt8(ascii: "\\") || $0 == UInt8(ascii: "\"") }) else {
                return "\"" + element + "\""
            }
            return "\"" + element.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
                + "\""
        }
        return .text("{" + quoted.joined(separator: ",") + "}")
    }
}

/// JSON text bound to a `json`/`jsonb` parameter, or read from one.
public struct PostgresJSON: PostgresEncodable, PostgresDecodable, Hashable {
    public var text: String

    public init(text: String) { self.text = text }

    /// Encodes `value` with sorted keys (stable bytes for tests and hashing).
    public init(encoding value: some Encodable) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        text = String(decoding: try encoder.encode(value), as: UTF8.self)
    }

    public var postgresBind: PostgresBind { .text(text) }

    public init(postgresText: String) throws { text = postgresText }

    /// Decodes the JSON into `type`.
    public func decode<T: Decodable>(_ type: T.Type) throws -> T {
        do {
            return try JSONDecoder().decode(type, from: Data(text.utf8))
        } catch {
            throw PostgresError(.decodingFailed, serverMessage: "JSON column is not a \(T.self)")
        }
    }
}

/// Something that runs one statement: a pool (autocommit) or a connection (inside a
/// transaction). Lets a store's statements run either way.
public protocol PostgresQuerying {
    @discardableResult
    func query(_ query: PostgresQuery) throws -> PostgresRows
}

extension PostgresPool: PostgresQuerying {}
extension PostgresConnection: PostgresQuerying {}
