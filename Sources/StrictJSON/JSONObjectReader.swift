/// A member of a JSON object that is missing, of the wrong type or out of bounds; `detail`
/// names the field ("field `user.email` must be a string") and never echoes its value.
public struct JSONFieldError: Error, Sendable, Equatable, CustomStringConvertible {
    public let detail: String

    public init(_ detail: String) { self.detail = detail }

    public var description: String { detail }
}

/// Typed access to a JSON object's members that throws `JSONFieldError` naming the field
/// (the HTTP server answers it as 400 `invalid_request`), without Codable's cost on hot paths.
public struct JSONObjectReader: Sendable {
    public let members: [String: JSONValue]
    let path: String

    /// `path` names the object in problems (`user` → "field `user.email`").
    public init(members: [String: JSONValue], path: String) {
        self.members = members
        self.path = path
    }

    private func name(_ key: String) -> String { path.isEmpty ? key : path + "." + key }

    /// A string member; nil when absent or null. U+0000 is refused: no text column can
    /// hold it (PostgreSQL refuses the bind), so it could only end as a 500 further in.
    public func string(_ key: String) throws -> String? {
        switch members[key] {
        case nil, .null?: return nil
        case .string(let value)?: return try checked(value, key)
        default: throw JSONFieldError("field `\(name(key))` must be a string")
        }
    }

    private func checked(_ value: String, _ key: String) throws -> String {
        // Over the bytes at once where the string is contiguous (a native one always is): the
        // UTF-8 view's own `contains` walks the string's guts per byte, 0.8% of a login's CPU
        // for its 800-byte identity token.
        let hasNUL = value.utf8.withContiguousStorageIfAvailable { $0.contains(0) } ?? value.utf8.contains(0)
        guard !hasNUL else { throw JSONFieldError("field `\(name(key))` must not contain U+0000") }
        return value
    }

    /// A required string member.
    public func requiredString(_ key: String) throws -> String {
        guard let value = try string(key) else { throw JSONFieldError("field `\(name(key))` is required") }
        return value
    }

    public func bool(_ key: String) throws -> Bool? {
        switch members[key] {
        case nil, .null?: return nil
        case .bool(let value)?: return value
        default: throw JSONFieldError("field `\(name(key))` must be a boolean")
        }
    }

    public func integer(_ key: String) throws -> Int? {
        switch members[key] {
        case nil, .null?: return nil
        case let value?:
            guard let integer = value.integerValue else { throw JSONFieldError("field `\(name(key))` must be an integer") }
            return Int(integer)
        }
    }

    /// A nested object member; nil when absent or null.
    public func object(_ key: String) throws -> JSONObjectReader? {
        switch members[key] {
        case nil, .null?: return nil
        case .object(let value)?: return JSONObjectReader(members: value, path: name(key))
        default: throw JSONFieldError("field `\(name(key))` must be an object")
        }
    }

    /// A list of strings; nil when absent or null.
    public func strings(_ key: String) throws -> [String]? {
        switch members[key] {
        case nil, .null?: return nil
        case .array(let values)?:
            let strings = values.compactMap(\.stringValue)
            guard strings.count == values.count else { throw JSONFieldError("field `\(name(key))` must list strings") }
            return try strings.map { try checked($0, key) }
        default: throw JSONFieldError("field `\(name(key))` must be a list of strings")
        }
    }
}
