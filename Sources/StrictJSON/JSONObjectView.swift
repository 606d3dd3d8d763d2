#if canImport(Glibc)
import Glibc
#endif

/// A strict JSON object whose members are found by name and built only when asked for:
/// for reading a few claims of a JWT (every login's identity token) without building a
/// hash table and a String for every name and value, most of which are never read.
///
/// The whole text is checked when the view is made, exactly as `JSONValue.parse` checks it
/// (duplicate names refused, strings valid UTF-8, nesting bounded), so reading a member
/// cannot fail. Duplicates are what a `[String: JSONValue]` would merge: plain ASCII names
/// compare by bytes, any other name as a Swift `String` (canonical equivalence, so `"é"`
/// and `"e\u0301"` are one name here as in `parseObject`).
public struct JSONObjectView: Sendable {
    enum Name: Sendable {
        /// Where a plain ASCII name's bytes are in the text.
        case raw(Range<Int>)
        /// An escaped or non-ASCII name, decoded.
        case decoded(String)
    }

    /// Objects up to this size are checked for duplicate names by comparing; larger ones
    /// (never a real token, but a hostile one) by a set, so the check stays linear.
    static let linearLimit = 32

    let bytes: [UInt8]
    /// One entry per member: one array, so a view costs one allocation.
    private var members: [Member] = []
    /// Every name, once the object is past `linearLimit` members.
    private var nameSet: Set<String>? = nil
    /// Whether some name is not plain ASCII (then names compare as Strings).
    private var hasDecodedName = false

    private struct Member: Sendable {
        var name: Name
        /// The name's length and first seven bytes: most comparisons end at this integer.
        var key: UInt64
        var value: Range<Int>
    }

    init(bytes: [UInt8]) {
        self.bytes = bytes
        members.reserveCapacity(16)
    }

    /// Parses text that must be one JSON object.
    /// - Throws: `JSONParseError`, also when the text is JSON but not an object.
    public init(parsing bytes: [UInt8]) throws {
        self = try JSONParser.parseView(bytes)
    }

    /// How many members the object has.
    public var count: Int { members.count }

    /// The member's value, or nil when the object has no member of that name.
    public subscript(name: String) -> JSONValue? {
        guard let found = position(of: name) else { return nil }
        // The text was checked when the view was made, so this cannot fail.
        return try? JSONParser.value(in: bytes, at: members[found].value)
    }

    /// `self[name]?.stringValue == expected`, without building a String when both are
    /// plain ASCII (then `==`'s canonical equivalence is byte equality) and the value has
    /// no escape.
    public func isString(_ name: String, equalTo expected: String) -> Bool {
        guard let found = position(of: name) else { return false }
        let range = members[found].value
        var expected = expected
        let plain = bytes.withUnsafeBufferPointer { buffer in
            expected.withUTF8 { wanted -> Bool? in
                let value = UnsafeBufferPointer(rebasing: buffer[range])
                guard value.count >= 2, value[0] == UInt8(ascii: "\""),
                    !value.contains(where: { $0 == UInt8(ascii: "\\") || $0 >= 0x80 }),
                    !wanted.contains(where: { $0 >= 0x80 })
                else { return nil }  // not a string, escapes or non-ASCII: the general path
                return value.count - 2 == wanted.count
                    && (wanted.isEmpty || memcmp(value.baseAddress! + 1, wanted.baseAddress!, wanted.count) == 0)
            }
        }
        if let plain { return plain }
        return self[name]?.stringValue == expected
    }

    /// Every member, built (for callers that need the whole object).
    public var dictionary: [String: JSONValue] {
        var members: [String: JSONValue] = [:]
        for member in self.members {
            members[text(of: member.name)] = try? JSONParser.value(in: bytes, at: member.value)
        }
        return members
    }

    /// Adds a member; false (and nothing added) when the name is already there. `source` is
    /// the scanner's buffer over `bytes`: a raw name is read from it without another
    /// closure over the array (this runs for every claim of every token).
    mutating func append(_ name: Name, in source: UnsafeBufferPointer<UInt8>, value: Range<Int>) -> Bool {
        let key: UInt64
        switch name {
        case .raw(let range):
            let bytes = UnsafeBufferPointer(rebasing: source[range])
            key = Self.key(bytes)
            if nameSet == nil, !hasDecodedName, index(of: bytes, key: key) != nil { return false }
        case .decoded:
            key = withBytes(of: name) { Self.key($0) }
            hasDecodedName = true
        }
        if nameSet != nil {
            guard nameSet!.insert(self.text(of: name)).inserted else { return false }
        } else if hasDecodedName {
            // Not every name is plain ASCII: compare as Strings, as a dictionary's keys do.
            let text = self.text(of: name)
            if members.contains(where: { self.text(of: $0.name) == text }) { return false }
        }
        members.append(Member(name: name, key: key, value: value))
        if nameSet == nil, members.count > Self.linearLimit {
            nameSet = Set(members.map { self.text(of: $0.name) })
        }
        return true
    }

    /// The member named `name` as a dictionary key would find it: by bytes, and when either
    /// side is not plain ASCII also by canonical equivalence (`"\u{212A}"` finds `"K"`).
    private func position(of name: String) -> Int? {
        var name = name
        let (found, ascii) = name.withUTF8 { (index(of: $0, key: Self.key($0)), !$0.contains { $0 >= 0x80 }) }
        if let found { return found }
        guard hasDecodedName || !ascii else { return nil }
        return members.firstIndex { text(of: $0.name) == name }
    }

    private func text(of name: Name) -> String {
        switch name {
        case .raw: withBytes(of: name) { String(decoding: $0, as: UTF8.self) }
        case .decoded(let text): text
        }
    }

    private func index(of name: UnsafeBufferPointer<UInt8>, key: UInt64) -> Int? {
        // Through a buffer pointer: indexing the array would copy each Member (and retain
        // its name) only to read the key, and this runs for every member of every token.
        members.withUnsafeBufferPointer { members in
            for position in members.indices where members[position].key == key {
                // Equal keys mean equal lengths and first seven bytes; compare the rest.
                if name.count <= 7
                    || withBytes(of: members[position].name, { memcmp($0.baseAddress!, name.baseAddress!, name.count) == 0 })
                {
                    return position
                }
            }
            return nil
        }
    }

    private func withBytes<T>(of name: Name, _ body: (UnsafeBufferPointer<UInt8>) throws -> T) rethrows -> T {
        switch name {
        case .raw(let range):
            return try bytes.withUnsafeBufferPointer { try body(UnsafeBufferPointer(rebasing: $0[range])) }
        case .decoded(let decoded):
            var decoded = decoded
            return try decoded.withUTF8 { try body($0) }
        }
    }

    private static func key(_ name: UnsafeBufferPointer<UInt8>) -> UInt64 {
        var key = UInt64(min(name.count, 255)) << 56
        for position in 0..<min(name.count, 7) { key |= UInt64(name[position]) << (8 * UInt64(position)) }
        return key
    }
}
