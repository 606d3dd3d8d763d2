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
    /// One entry per member: one array of plain values (nothing to retain when it is
    /// copied or searched), so a view of plain ASCII names costs one allocation.
    private var members: [Member] = []
    /// The escaped or non-ASCII names, decoded (rare: JWT claim names are plain ASCII).
    private var decodedNames: [String] = []
    /// Every name, once the object is past `linearLimit` members.
    private var nameSet: Set<String>? = nil
    /// Whether some name is not plain ASCII (then names compare as Strings).
    private var hasDecodedName = false

    private struct Member: Sendable {
        /// The name's length and first seven bytes: most comparisons end at this integer.
        var key: UInt64
        var name: Location
        var value: Range<Int>
    }

    /// Where a member's name is: its bytes in the text, or its index in `decodedNames`.
    private enum Location: Sendable {
        case raw(Range<Int>)
        case decoded(Int)
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

    /// A member name prepared for lookups: its comparison key and whether it is plain ASCII
    /// are worked out once, not on every read (the identity-token check reads a dozen
    /// claims of every token by the same names).
    public struct MemberName: Sendable, Hashable, ExpressibleByStringLiteral {
        public let text: String
        let utf8: [UInt8]
        let key: UInt64
        let isASCII: Bool

        public init(_ text: String) {
            self.text = text
            utf8 = Array(text.utf8)
            key = utf8.withUnsafeBufferPointer { JSONObjectView.key($0) }
            isASCII = !utf8.contains { $0 >= 0x80 }
        }

        public init(stringLiteral value: String) { self.init(value) }
    }

    /// The member's value, or nil when the object has no member of that name.
    public subscript(name: String) -> JSONValue? { self[MemberName(name)] }

    /// The member's value, or nil when the object has no member of that name.
    public subscript(name: MemberName) -> JSONValue? {
        guard let found = position(of: name) else { return nil }
        return value(at: members[found].value)
    }

    /// The value whose checked text is at `range`.
    private func value(at range: Range<Int>) -> JSONValue? {
        // The text was checked when the view was made, so this cannot fail.
        bytes.withUnsafeBufferPointer { try? JSONParser.value(in: $0, at: range) }
    }

    /// `self[name]?.stringValue == expected`, without building a String when both are
    /// plain ASCII (then `==`'s canonical equivalence is byte equality) and the value has
    /// no escape.
    public func isString(_ name: MemberName, equalTo expected: String) -> Bool {
        guard let found = position(of: name) else { return false }
        let range = members[found].value
        var expected = expected
        let plain = bytes.withUnsafeBufferPointer { buffer in
            expected.withUTF8 { wanted -> Bool? in
                let value = UnsafeBufferPointer(rebasing: buffer[range])
                guard value.count >= 2, value[0] == UInt8(ascii: "\"") else { return nil }  // not a string
                let contents = UnsafeBufferPointer(rebasing: value[1..<(value.count - 1)])
                // Escapes or non-ASCII on either side: the general path.
                guard PlainText.isPlain(contents), PlainText.isPlain(wanted) else { return nil }
                return contents.count == wanted.count
                    && (wanted.isEmpty || memcmp(contents.baseAddress!, wanted.baseAddress!, wanted.count) == 0)
            }
        }
        if let plain { return plain }
        return self[name]?.stringValue == expected
    }

    /// `isString(_:equalTo:)` for a name not prepared in advance.
    public func isString(_ name: String, equalTo expected: String) -> Bool {
        isString(MemberName(name), equalTo: expected)
    }

    /// Every member, built (for callers that need the whole object).
    public var dictionary: [String: JSONValue] {
        var members: [String: JSONValue] = [:]
        for member in self.members {
            members[text(of: member.name)] = value(at: member.value)
        }
        return members
    }

    /// Adds a member; false (and nothing added) when the name is already there. `source` is
    /// the scanner's buffer over `bytes`: a raw name is read from it without another
    /// closure over the array (this runs for every claim of every token).
    mutating func append(_ name: Name, in source: UnsafeBufferPointer<UInt8>, value: Range<Int>) -> Bool {
        let key: UInt64
        let location: Location
        switch name {
        case .raw(let range):
            key = Self.key(of: range, in: source)
            if nameSet == nil, !hasDecodedName, index(of: UnsafeBufferPointer(rebasing: source[range]), key: key, in: source) != nil {
                return false
            }
            location = .raw(range)
        case .decoded(var text):
            key = text.withUTF8 { Self.key($0) }
            hasDecodedName = true
            decodedNames.append(text)
            location = .decoded(decodedNames.count - 1)
        }
        if nameSet != nil {
            guard nameSet!.insert(self.text(of: location)).inserted else { return false }
        } else if hasDecodedName {
            // Not every name is plain ASCII: compare as Strings, as a dictionary's keys do.
            let text = self.text(of: location)
            if members.contains(where: { self.text(of: $0.name) == text }) { return false }
        }
        members.append(Member(key: key, name: location, value: value))
        if nameSet == nil, members.count > Self.linearLimit {
            nameSet = Set(members.map { self.text(of: $0.name) })
        }
        return true
    }

    /// The member named `name` as a dictionary key would find it: by bytes, and when either
    /// side is not plain ASCII also by canonical equivalence (`"\u{212A}"` finds `"K"`).
    private func position(of name: MemberName) -> Int? {
        let found = bytes.withUnsafeBufferPointer { source in
            name.utf8.withUnsafeBufferPointer { index(of: $0, key: name.key, in: source) }
        }
        if let found { return found }
        guard hasDecodedName || !name.isASCII else { return nil }
        return members.firstIndex { self.text(of: $0.name) == name.text }
    }

    private func text(of name: Location) -> String {
        switch name {
        case .raw(let range): bytes.withUnsafeBufferPointer { String(decoding: UnsafeBufferPointer(rebasing: $0[range]), as: UTF8.self) }
        case .decoded(let index): decodedNames[index]
        }
    }

    /// The position of the member whose name has exactly these bytes; `source` is the
    /// buffer over `bytes`.
    private func index(of name: UnsafeBufferPointer<UInt8>, key: UInt64, in source: UnsafeBufferPointer<UInt8>) -> Int? {
        members.withUnsafeBufferPointer { members in
            for position in members.indices where members[position].key == key {
                // Equal keys mean equal lengths and first seven bytes; compare the rest.
                if name.count <= 7 || hasName(members[position].name, name, in: source) { return position }
            }
            return nil
        }
    }

    /// Whether the name at `location` has exactly the bytes `name` (of the same length).
    private func hasName(_ location: Location, _ name: UnsafeBufferPointer<UInt8>, in source: UnsafeBufferPointer<UInt8>) -> Bool {
        switch location {
        case .raw(let range):
            return memcmp(source.baseAddress! + range.lowerBound, name.baseAddress!, name.count) == 0
        case .decoded(let index):
            var decoded = decodedNames[index]
            return decoded.withUTF8 { memcmp($0.baseAddress!, name.baseAddress!, name.count) == 0 }
        }
    }

    /// `key(_:)` of the name at `range` of `source`, with one unaligned load when eight
    /// bytes can be read there (always, but at the very end of a text: a name is
    /// followed at least by its closing quote, a colon and a value).
    private static func key(of range: Range<Int>, in source: UnsafeBufferPointer<UInt8>) -> UInt64 {
        guard range.lowerBound + 8 <= source.count else { return key(UnsafeBufferPointer(rebasing: source[range])) }
        let word = UInt64(littleEndian: UnsafeRawPointer(source.baseAddress! + range.lowerBound).loadUnaligned(as: UInt64.self))
        let count = range.count
        let mask: UInt64 = count >= 7 ? 0x00FF_FFFF_FFFF_FFFF : (1 << (8 * UInt64(count))) - 1
        return word & mask | UInt64(min(count, 255)) << 56
    }

    /// A name's length (at most 255) in the top byte, and its first seven bytes below.
    static func key(_ name: UnsafeBufferPointer<UInt8>) -> UInt64 {
        var key = UInt64(min(name.count, 255)) << 56
        for position in 0..<min(name.count, 7) { key |= UInt64(name[position]) << (8 * UInt64(position)) }
        return key
    }
}
