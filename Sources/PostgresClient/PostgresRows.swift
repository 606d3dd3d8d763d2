import Foundation

/// The rows a statement returned, copied out of libpq's result so they can outlive it
/// and cross threads.
public struct PostgresRows: Sendable, RandomAccessCollection {
    /// Column names in result order.
    public let columns: [String]
    /// Text-format values, row-major; `nil` is SQL NULL (bytea arrives as raw bytes in `bytes`).
    let cells: [PostgresCell]
    /// Rows affected by INSERT/UPDATE/DELETE (from the command tag), 0 otherwise.
    public let affectedRows: Int

    init(columns: [String], cells: [PostgresCell], affectedRows: Int) {
        self.columns = columns
        self.cells = cells
        self.affectedRows = affectedRows
    }

    public var startIndex: Int { 0 }
    public var endIndex: Int { columns.isEmpty ? 0 : cells.count / columns.count }
    public subscript(position: Int) -> PostgresRow { PostgresRow(rows: self, index: position) }

    /// The first row, or throws `decodingFailed` if there is none.
    public func single() throws -> PostgresRow {
        guard let row = first else { throw PostgresError(.decodingFailed, serverMessage: "expected one row, got none") }
        return row
    }
}

enum PostgresCell: Sendable {
    case null
    case text(String)
}

/// One row; decode columns by position or name into Swift types.
public struct PostgresRow: Sendable {
    let rows: PostgresRows
    let index: Int

    func cell(_ column: Int) throws -> PostgresCell {
        guard column >= 0, column < rows.columns.count else {
            throw PostgresError(.decodingFailed, serverMessage: "no column \(column)")
        }
        return rows.cells[index * rows.columns.count + column]
    }

    func columnIndex(_ name: String) throws -> Int {
        guard let column = rows.columns.firstIndex(of: name) else {
            throw PostgresError(.decodingFailed, serverMessage: "no column named \(name)")
        }
        return column
    }

    /// Whether the column is SQL NULL.
    public func isNull(_ column: Int) throws -> Bool {
        if case .null = try cell(column) { return true }
        return false
    }

    /// The column decoded as `T`; SQL NULL throws `decodingFailed`.
    public func decode<T: PostgresDecodable>(_ type: T.Type, _ column: Int) throws -> T {
        guard case .text(let text) = try cell(column) else {
            throw PostgresError(.decodingFailed, serverMessage: "column \(rows.columns[column]) is NULL, expected \(T.self)")
        }
        return try T(postgresText: text)
    }

    /// The column decoded as `T`, or `nil` for SQL NULL.
    public func decode<T: PostgresDecodable>(_ type: T?.Type, _ column: Int) throws -> T? {
        guard case .text(let text) = try cell(column) else { return nil }
        return try T(postgresText: text)
    }

    public func decode<T: PostgresDecodable>(_ type: T.Type, _ name: String) throws -> T {
        try decode(type, try columnIndex(name))
    }

    public func decode<T: PostgresDecodable>(_ type: T?.Type, _ name: String) throws -> T? {
        try decode(type, try columnIndex(name))
    }
}

/// A Swift type that can be read from a column's text representation.
public protocol PostgresDecodable: Sendable {
    init(postgresText: String) throws
}

extension PostgresDecodable {
    static func failure(_ text: String) -> PostgresError {
        PostgresError(.decodingFailed, serverMessage: "cannot decode \(Self.self) from column text")
    }
}

/// A state or outcome kept as text: conform an enum whose raw values are the SQL values, and
/// a value outside them fails to decode instead of passing as a string.
extension PostgresDecodable where Self: RawRepresentable, RawValue == String {
    public init(postgresText: String) throws {
        guard let value = Self(rawValue: postgresText) else { throw Self.failure(postgresText) }
        self = value
    }
}

extension String: PostgresDecodable {
    public init(postgresText: String) throws { self = postgresText }
}
/// Numbers: whatever Swift reads from the column's text (PostgreSQL's integer and float text
/// forms are Swift's).
extension PostgresDecodable where Self: LosslessStringConvertible {
    public init(postgresText: String) throws {
        guard let value = Self(postgresText) else { throw Self.failure(postgresText) }
        self = value
    }
}

extension Int: PostgresDecodable {}
extension Int64: PostgresDecodable {}
extension Int32: PostgresDecodable {}
extension Int16: PostgresDecodable {}
extension Double: PostgresDecodable {}
extension Bool: PostgresDecodable {
    public init(postgresText: String) throws {
        switch postgresText {
        case "t", "true": self = true
        case "f", "false": self = false
        default: throw Self.failure(postgresText)
        }
    }
}
extension UUID: PostgresDecodable {
    public init(postgresText: String) throws {
        guard let value = UUID(canonicalText: postgresText) else { throw Self.failure(postgresText) }
        self = value
    }
}
extension Date: PostgresDecodable {
    public init(postgresText: String) throws {
        guard let value = PostgresTimestamp.parse(postgresText) else { throw Self.failure(postgresText) }
        self = value
    }
}
extension Array: PostgresDecodable where Element == UInt8 {
    /// `bytea` in the server's default `hex` output format (`\x0a1b…`).
    public init(postgresText: String) throws {
        let utf8 = Array(postgresText.utf8)
        guard utf8.count >= 2, utf8[0] == UInt8(ascii: "\\"), utf8[1] == UInt8(ascii: "x"), utf8.count % 2 == 0 else {
            throw Self.failure(postgresText)
        }
        var bytes = [UInt8]()
        bytes.reserveCapacity((utf8.count - 2) / 2)
        var index = 2
        while index < utf8.count {
            guard let high = hexNibble(utf8[index]), let low = hexNibble(utf8[index + 1]) else {
                throw Self.failure(postgresText)
            }
            bytes.append(high << 4 | low)
            index += 2
        }
        self = bytes
    }
}
extension Data: PostgresDecodable {
    public init(postgresText: String) throws { self = Data(try [UInt8](postgresText: postgresText)) }
}

private func hexNibble(_ c: UInt8) -> UInt8? {
    switch c {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
    case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
    default: nil
    }
}
