#if canImport(Glibc)
    import Glibc
#endif

/// A strict RFC 8259 JSON reader for JOSE headers, JWT claims and JWKs. It refuses what
/// Foundation's decoders let through: duplicate member names in any object (RFC 7515 §4
/// and RFC 7519 §4 ask for rejection; parsers that keep the last one are how "duplicate
/// aud" confusion happens), lone surrogates, and nesting deeper than 32. It reads the bytes
/// once and builds `JSONValue`s directly, which also keeps token verification cheap.
enum JSONParser {
    static let maximumDepth = 32

    /// The value the text holds; throws `malformed` for anything that is not strict JSON.
    static func parse(_ bytes: [UInt8]) throws -> JSONValue {
        // One pass over a buffer pointer: no bounds-checked Array indexing or generic
        // collection code on the path every token verification takes.
        try bytes.withUnsafeBufferPointer { buffer in
            var scanner = Scanner(bytes: buffer)
            let value = try scanner.value(depth: 0)
            scanner.skipWhitespace()
            guard scanner.index == buffer.count else { throw malformed("trailing characters after the JSON value") }
            return value
        }
    }

    static func malformed(_ reason: String) -> JSONParseError { JSONParseError(reason: reason) }

    static func duplicate(_ name: String) -> JSONParseError { malformed("duplicate member name \"\(name)\"") }

    /// Parses text that must be one JSON object, as strictly as `parse` (every member checked,
    /// duplicate names refused), and returns the values of the members `names` lists, in that
    /// order, nil where absent. No dictionary and no String per name is built: this is how the
    /// claims of every login's identity token are read (see docs/benchmarks.md).
    /// - Parameter names: plain ASCII names.
    static func members(of bytes: [UInt8], named names: [StaticString]) throws -> [JSONValue?] {
        try bytes.withUnsafeBufferPointer { buffer in
            var scanner = Scanner(bytes: buffer)
            scanner.skipWhitespace()
            guard scanner.index < buffer.count, buffer[scanner.index] == UInt8(ascii: "{") else {
                throw malformed("not a JSON object")
            }
            var found = [JSONValue?](repeating: nil, count: names.count)
            var seen = MemberNames(bytes: buffer)
            try scanner.forEachMember(depth: 0) { name, value in
                try seen.insert(name)
                if let position = names.firstIndex(where: { name.equals($0, in: buffer) }) { found[position] = value }
            }
            scanner.skipWhitespace()
            guard scanner.index == buffer.count else { throw malformed("trailing characters after the JSON value") }
            return found
        }
    }

    /// A member name as read: its bytes' place in the text when plain ASCII without escapes,
    /// else decoded.
    enum Name {
        case plain(Range<Int>)
        case decoded(String)

        func string(in bytes: UnsafeBufferPointer<UInt8>) -> String {
            switch self {
            case .plain(let range): String(decoding: UnsafeBufferPointer(rebasing: bytes[range]), as: UTF8.self)
            case .decoded(let name): name
            }
        }

        /// Whether this is `wanted`, a plain ASCII name: byte equality for a plain name (for
        /// ASCII that is what String's canonical equivalence comes to), String equality else.
        func equals(_ wanted: StaticString, in bytes: UnsafeBufferPointer<UInt8>) -> Bool {
            switch self {
            case .plain(let range):
                return range.count == wanted.utf8CodeUnitCount
                    && memcmp(bytes.baseAddress! + range.lowerBound, wanted.utf8Start, range.count) == 0
            case .decoded(let name):
                return name == wanted.description
            }
        }
    }

    /// The names of one object's members so far, to refuse a duplicate as a dictionary's keys
    /// would: plain names compare by their bytes while the object has at most `linearLimit`
    /// members; past that (never a real token, but a hostile one), or once a name needed
    /// decoding (then names compare as Strings: `"\u212A"` is `"K"`), every name goes into a
    /// set, so the check stays linear in the text.
    struct MemberNames {
        static let linearLimit = 32
        let bytes: UnsafeBufferPointer<UInt8>
        private var plain: [Range<Int>] = []
        private var all: Set<String>? = nil

        init(bytes: UnsafeBufferPointer<UInt8>) {
            self.bytes = bytes
            plain.reserveCapacity(16)
        }

        mutating func insert(_ name: Name) throws {
            if all == nil, case .plain(let range) = name, plain.count < Self.linearLimit {
                for other in plain
                where other.count == range.count
                    && memcmp(bytes.baseAddress! + other.lowerBound, bytes.baseAddress! + range.lowerBound, range.count) == 0
                {
                    throw duplicate(name.string(in: bytes))
                }
                plain.append(range)
                return
            }
            if all == nil {
                all = Set(plain.map { Name.plain($0).string(in: bytes) })
                plain = []
            }
            let text = name.string(in: bytes)
            guard all!.insert(text).inserted else { throw duplicate(text) }
        }
    }

    private struct Scanner {
        let bytes: UnsafeBufferPointer<UInt8>
        var index = 0

        mutating func skipWhitespace() {
            while index < bytes.count {
                switch bytes[index] {
                case 0x20, 0x09, 0x0A, 0x0D: index += 1
                default: return
                }
            }
        }

        mutating func value(depth: Int) throws -> JSONValue {
            guard depth <= JSONParser.maximumDepth else { throw malformed("JSON nested too deeply") }
            skipWhitespace()
            guard index < bytes.count else { throw malformed("unexpected end of JSON") }
            switch bytes[index] {
            case UInt8(ascii: "{"): return try object(depth: depth)
            case UInt8(ascii: "["): return try array(depth: depth)
            case UInt8(ascii: "\""): return .string(try string())
            case UInt8(ascii: "t"):
                try literal("true")
                return .bool(true)
            case UInt8(ascii: "f"):
                try literal("false")
                return .bool(false)
            case UInt8(ascii: "n"):
                try literal("null")
                return .null
            default: return try number()
            }
        }

        mutating func object(depth: Int) throws -> JSONValue {
            var members: [String: JSONValue] = [:]
            members.reserveCapacity(16)
            let text = bytes
            try forEachMember(depth: depth) { name, member in
                let name = name.string(in: text)
                guard members.updateValue(member, forKey: name) == nil else { throw duplicate(name) }
            }
            return .object(members)
        }

        /// Reads the object at `index` (its `{`), handing each member to `body` in text order.
        mutating func forEachMember(depth: Int, _ body: (Name, JSONValue) throws -> Void) throws {
            index += 1
            skipWhitespace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
                index += 1
                return
            }
            while true {
                skipWhitespace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw malformed("expected a member name") }
                let name = try self.name()
                skipWhitespace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw malformed("expected ':'") }
                index += 1
                try body(name, try value(depth: depth + 1))
                guard try another(closing: UInt8(ascii: "}"), of: "object") else { return }
            }
        }

        mutating func array(depth: Int) throws -> JSONValue {
            index += 1
            var elements: [JSONValue] = []
            skipWhitespace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
                index += 1
                return .array(elements)
            }
            while true {
                elements.append(try value(depth: depth + 1))
                guard try another(closing: UInt8(ascii: "]"), of: "array") else { return .array(elements) }
            }
        }

        /// After a member or an element: past a `,` (true: another follows) or past `closing`
        /// (false: the object or array ends).
        mutating func another(closing: UInt8, of container: String) throws -> Bool {
            skipWhitespace()
            guard index < bytes.count else { throw malformed("unterminated \(container)") }
            let byte = bytes[index]
            guard byte == UInt8(ascii: ",") || byte == closing else {
                throw malformed("expected ',' or '\(Character(Unicode.Scalar(closing)))'")
            }
            index += 1
            return byte == UInt8(ascii: ",")
        }

        /// Reads a string; escapes are decoded, so `"a"` and `"\u0061"` are the same member
        /// name. Most strings have no escape: those are sliced out without copying byte by byte.
        mutating func string() throws -> String {
            guard let (contents, ascii) = unescaped() else {
                let decoded = try escapedString(from: index + 1)
                return try decoded.withUnsafeBufferPointer { try text($0) }
            }
            index = contents.upperBound + 1
            let slice = UnsafeBufferPointer(rebasing: bytes[contents])
            // ASCII needs no validation; anything else must be well-formed UTF-8.
            return ascii ? String(decoding: slice, as: UTF8.self) : try text(slice)
        }

        /// A member name: where its bytes are when it is plain (ASCII, no escape: what every
        /// JWT claim name is), else decoded.
        mutating func name() throws -> Name {
            guard let (contents, ascii) = unescaped(), ascii else { return .decoded(try string()) }
            index = contents.upperBound + 1
            return .plain(contents)
        }

        /// Where the contents of the string at `index` (its opening quote) end, and whether they
        /// are ASCII, when they hold no escape and no control character; nil otherwise.
        func unescaped() -> (contents: Range<Int>, ascii: Bool)? {
            var cursor = index + 1
            var ascii = true
            while cursor < bytes.count {
                let byte = bytes[cursor]
                if byte == UInt8(ascii: "\"") { return ((index + 1)..<cursor, ascii) }
                if byte == UInt8(ascii: "\\") || byte < 0x20 { return nil }
                if byte >= 0x80 { ascii = false }
                cursor += 1
            }
            return nil
        }

        private mutating func escapedString(from start: Int) throws -> [UInt8] {
            index = start
            var decoded: [UInt8] = []
            while index < bytes.count {
                let byte = bytes[index]
                index += 1
                switch byte {
                case UInt8(ascii: "\""):
                    return decoded
                case UInt8(ascii: "\\"):
                    guard index < bytes.count else { throw malformed("unterminated escape") }
                    let escape = bytes[index]
                    index += 1
                    switch escape {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): decoded.append(escape)
                    case UInt8(ascii: "b"): decoded.append(0x08)
                    case UInt8(ascii: "f"): decoded.append(0x0C)
                    case UInt8(ascii: "n"): decoded.append(0x0A)
                    case UInt8(ascii: "r"): decoded.append(0x0D)
                    case UInt8(ascii: "t"): decoded.append(0x09)
                    case UInt8(ascii: "u"):
                        var scalar = try hex4()
                        if (0xD800...0xDBFF).contains(scalar) {
                            // A high surrogate must be followed by \u and a low surrogate.
                            guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"),
                                bytes[index + 1] == UInt8(ascii: "u")
                            else { throw malformed("lone surrogate in string") }
                            index += 2
                            let low = try hex4()
                            guard (0xDC00...0xDFFF).contains(low) else { throw malformed("bad surrogate pair") }
                            scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                        } else if (0xDC00...0xDFFF).contains(scalar) {
                            throw malformed("lone surrogate in string")
                        }
                        decoded.append(contentsOf: Array(String(Character(Unicode.Scalar(scalar)!)).utf8))
                    default:
                        throw malformed("invalid escape in string")
                    }
                default:
                    guard byte >= 0x20 else { throw malformed("control character in string") }
                    decoded.append(byte)
                }
            }
            throw malformed("unterminated string")
        }

        /// The bytes as a String, refusing invalid UTF-8 (RFC 8259 §8.1).
        func text(_ bytes: UnsafeBufferPointer<UInt8>) throws -> String {
            guard let text = String(validating: bytes, as: UTF8.self) else { throw malformed("string is not UTF-8") }
            return text
        }

        mutating func hex4() throws -> UInt32 {
            guard index + 4 <= bytes.count else { throw malformed("short \\u escape") }
            var value: UInt32 = 0
            for _ in 0..<4 {
                let c = bytes[index]
                index += 1
                let digit: UInt32
                switch c {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(c - UInt8(ascii: "0"))
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(c - UInt8(ascii: "a") + 10)
                case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(c - UInt8(ascii: "A") + 10)
                default: throw malformed("bad \\u escape")
                }
                value = value << 4 | digit
            }
            return value
        }

        mutating func literal(_ word: StaticString) throws {
            let count = word.utf8CodeUnitCount
            guard index + count <= bytes.count else { throw malformed("invalid literal") }
            let expected = UnsafeBufferPointer(start: word.utf8Start, count: count)
            for offset in 0..<count where bytes[index + offset] != expected[offset] { throw malformed("invalid literal") }
            index += count
        }

        mutating func number() throws -> JSONValue {
            let start = index
            if index < bytes.count, bytes[index] == UInt8(ascii: "-") { index += 1 }
            func digits() -> Int {
                let from = index
                while index < bytes.count, (48...57).contains(bytes[index]) { index += 1 }
                return index - from
            }
            let integerDigits = digits()
            guard integerDigits > 0 else { throw malformed("invalid value") }
            if integerDigits > 1, bytes[start + (bytes[start] == UInt8(ascii: "-") ? 1 : 0)] == UInt8(ascii: "0") {
                throw malformed("leading zero in number")
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
                index += 1
                guard digits() > 0 else { throw malformed("invalid number") }
            }
            var isInteger = true
            if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
                isInteger = false
                index += 1
                if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
                guard digits() > 0 else { throw malformed("invalid number") }
            }
            let digitsStart = start + (bytes[start] == UInt8(ascii: "-") ? 1 : 0)
            if isInteger, index - start == integerDigits + (digitsStart - start), integerDigits <= 18 {
                // A plain integer of up to 18 digits cannot overflow Int64: accumulate it directly.
                var magnitude: Int64 = 0
                for position in digitsStart..<index { magnitude = magnitude * 10 + Int64(bytes[position] &- 48) }
                return .integer(digitsStart > start ? -magnitude : magnitude)
            }
            let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
            if isInteger && !text.contains("."), let integer = Int64(text) { return .integer(integer) }
            guard let double = Double(text), double.isFinite else { throw malformed("number out of range") }
            return .double(double)
        }
    }
}

/// Why text was refused as JSON.
public struct JSONParseError: Error, Hashable, Sendable, CustomStringConvertible {
    public let reason: String
    public var description: String { "invalid JSON: \(reason)" }
}
