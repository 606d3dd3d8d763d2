/// A strict RFC 8259 JSON reader for JOSE headers, JWT claims and JWKs. It refuses what
/// Foundation's decoders let through: duplicate member names in any object (RFC 7515 §4
/// and RFC 7519 §4 ask for rejection; parsers that keep the last one are how "duplicate
/// aud" confusion happens), lone surrogates, and nesting deeper than 32. It reads the bytes
/// once and builds `JSONValue`s directly, which also keeps token verification cheap.
enum JSONParser {
    static let maximumDepth = 32

    /// The value the text holds; throws `malformed` for anything that is not strict JSON.
    static func parse(_ bytes: [UInt8]) throws -> JSONValue {
        try scan(bytes) { try $0.value(depth: 0) }
    }

    /// Checks that the text is one strict JSON object and notes where each member's name
    /// and value are, building no value (see `JSONObjectView`).
    static func parseView(_ bytes: [UInt8]) throws -> JSONObjectView {
        try scan(bytes) { try $0.objectView(of: bytes) }
    }

    /// The value at `range` of text `parseView` accepted.
    static func value(in buffer: UnsafeBufferPointer<UInt8>, at range: Range<Int>) throws -> JSONValue {
        var scanner = Scanner(bytes: UnsafeBufferPointer(rebasing: buffer[range]))
        return try scanner.value(depth: 1)
    }

    private static func scan<T>(_ bytes: [UInt8], _ read: (inout Scanner) throws -> T) throws -> T {
        // One pass over a buffer pointer: no bounds-checked Array indexing or generic
        // collection code on the path every token verification takes.
        try bytes.withUnsafeBufferPointer { buffer in
            var scanner = Scanner(bytes: buffer)
            let value = try read(&scanner)
            scanner.skipWhitespace()
            guard scanner.index == buffer.count else { throw malformed("trailing characters after the JSON value") }
            return value
        }
    }

    static func malformed(_ reason: String) -> JSONParseError { JSONParseError(reason: reason) }

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
            try readMembers { scanner in
                let name = try scanner.string()
                try scanner.colon()
                let member = try scanner.value(depth: depth + 1)
                guard members.updateValue(member, forKey: name) == nil else {
                    throw malformed("duplicate member name \"\(name)\"")
                }
            }
            return .object(members)
        }

        /// The top-level object of `source` (the bytes this scanner reads) as a view:
        /// names are compared as bytes and values only checked, not built.
        mutating func objectView(of source: [UInt8]) throws -> JSONObjectView {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "{") else { throw malformed("not a JSON object") }
            var view = JSONObjectView(bytes: source)
            try readMembers { scanner in
                let name = try scanner.memberName()
                try scanner.colon()
                scanner.skipWhitespace()
                let start = scanner.index
                try scanner.skipValue()
                guard view.append(name, in: scanner.bytes, value: start..<scanner.index) else { throw malformed("duplicate member name") }
            }
            return view
        }

        /// Reads `{ "name": value, … }` from the opening brace, letting `member` read each
        /// name, the colon and the value.
        private mutating func readMembers(_ member: (inout Scanner) throws -> Void) throws {
            index += 1
            skipWhitespace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
                index += 1
                return
            }
            while true {
                skipWhitespace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw malformed("expected a member name") }
                try member(&self)
                skipWhitespace()
                guard index < bytes.count else { throw malformed("unterminated object") }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                    continue
                }
                guard bytes[index] == UInt8(ascii: "}") else { throw malformed("expected ',' or '}'") }
                index += 1
                return
            }
        }

        private mutating func colon() throws {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw malformed("expected ':'") }
            index += 1
        }

        /// A member name: the range of its bytes when it is plain ASCII (the usual case),
        /// otherwise its decoded bytes.
        private mutating func memberName() throws -> JSONObjectView.Name {
            if let range = plainString() { return .raw(range) }
            return .decoded(try string())
        }

        /// At an opening quote: when the string is printable ASCII without escapes (what
        /// JWT names and most values are), moves past it and returns its contents' range;
        /// otherwise stays put and returns nil, for `string()` to check in full.
        private mutating func plainString() -> Range<Int>? {
            let end = PlainText.end(in: bytes, from: index + 1)
            guard end < bytes.count, bytes[end] == UInt8(ascii: "\"") else { return nil }
            defer { index = end + 1 }
            return index + 1..<end
        }

        /// Checks one value without building it (strings and numbers, the usual claims);
        /// nested objects and arrays are parsed, so their names are checked too.
        private mutating func skipValue() throws {
            guard index < bytes.count else { throw malformed("unexpected end of JSON") }
            switch bytes[index] {
            case UInt8(ascii: "\""):
                if plainString() == nil { _ = try string() }  // escapes or non-ASCII: the full check
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                let start = index
                let scanned = try scanNumber()
                if !scanned.isPlainInteger || index - scanned.digitsStart > 18 {
                    // Fractions, exponents and long integers may be out of range (5e322),
                    // which only building them finds; short plain integers cannot be.
                    index = start
                    _ = try number()
                }
            default:
                _ = try value(depth: 1)
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
                skipWhitespace()
                guard index < bytes.count else { throw malformed("unterminated array") }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                    continue
                }
                guard bytes[index] == UInt8(ascii: "]") else { throw malformed("expected ',' or ']'") }
                index += 1
                return .array(elements)
            }
        }

        /// Reads a string; escapes are decoded, so `"a"` and `"\u0061"` are the same member
        /// name. Most strings have no escape: those are sliced out without copying byte by byte.
        mutating func string() throws -> String {
            index += 1
            let start = index
            var cursor = PlainText.end(in: bytes, from: start)  // past the plain ASCII run at once
            var ascii = true
            while cursor < bytes.count {
                let byte = bytes[cursor]
                if byte == UInt8(ascii: "\"") {
                    index = cursor + 1
                    let slice = UnsafeBufferPointer(rebasing: bytes[start..<cursor])
                    // ASCII needs no validation; anything else must be well-formed UTF-8.
                    return ascii ? String(decoding: slice, as: UTF8.self) : try text(slice)
                }
                if byte == UInt8(ascii: "\\") || byte < 0x20 { break }
                if byte >= 0x80 { ascii = false }
                cursor += 1
            }
            let decoded = try escapedString(from: start)
            return try decoded.withUnsafeBufferPointer { try text($0) }
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
            let scanned = try scanNumber()
            let negative = scanned.digitsStart > start
            if scanned.isPlainInteger, index - scanned.digitsStart <= 18 {
                // A plain integer of up to 18 digits cannot overflow Int64: accumulate it directly.
                var magnitude: Int64 = 0
                for position in scanned.digitsStart..<index { magnitude = magnitude * 10 + Int64(bytes[position] &- 48) }
                return .integer(negative ? -magnitude : magnitude)
            }
            let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
            if scanned.isInteger && !text.contains("."), let integer = Int64(text) { return .integer(integer) }
            guard let double = Double(text), double.isFinite else { throw malformed("number out of range") }
            return .double(double)
        }

        /// Moves past a number, checking RFC 8259 §6's grammar
        /// (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`) without building it: what
        /// `skipValue` needs for every numeric claim, and what `number` builds from.
        mutating func scanNumber() throws -> (digitsStart: Int, isPlainInteger: Bool, isInteger: Bool) {
            let count = bytes.count
            var cursor = index
            if cursor < count, bytes[cursor] == UInt8(ascii: "-") { cursor += 1 }
            let digitsStart = cursor
            while cursor < count, bytes[cursor] &- 48 < 10 { cursor += 1 }
            let integerDigits = cursor - digitsStart
            guard integerDigits > 0 else { throw malformed("invalid value") }
            if integerDigits > 1, bytes[digitsStart] == UInt8(ascii: "0") { throw malformed("leading zero in number") }
            var isPlainInteger = true
            var isInteger = true
            if cursor < count, bytes[cursor] == UInt8(ascii: ".") {
                isPlainInteger = false
                cursor += 1
                let from = cursor
                while cursor < count, bytes[cursor] &- 48 < 10 { cursor += 1 }
                guard cursor > from else { throw malformed("invalid number") }
            }
            if cursor < count, bytes[cursor] == UInt8(ascii: "e") || bytes[cursor] == UInt8(ascii: "E") {
                isPlainInteger = false
                isInteger = false
                cursor += 1
                if cursor < count, bytes[cursor] == UInt8(ascii: "+") || bytes[cursor] == UInt8(ascii: "-") { cursor += 1 }
                let from = cursor
                while cursor < count, bytes[cursor] &- 48 < 10 { cursor += 1 }
                guard cursor > from else { throw malformed("invalid number") }
            }
            index = cursor
            return (digitsStart, isPlainInteger, isInteger)
        }
    }
}

/// Why text was refused as JSON.
public struct JSONParseError: Error, Hashable, Sendable, CustomStringConvertible {
    public let reason: String
    public var description: String { "invalid JSON: \(reason)" }
}
