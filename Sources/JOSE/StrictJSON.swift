/// Structural validation of JSON text that Foundation's decoders do not do: it rejects
/// duplicate member names in any object (RFC 7515 §4 and RFC 7519 §4 require JOSE
/// headers and JWT claims to be rejected, or unambiguous, when names repeat; parsers
/// that keep the last one are how "duplicate aud" confusion happens), and bounds nesting.
///
/// It reads the text as RFC 8259 JSON; the actual values are then decoded by Foundation.
enum StrictJSON {
    static let maximumDepth = 32

    /// Throws `malformed` for invalid JSON, a duplicate member name, or nesting deeper than 32.
    static func validate(_ bytes: [UInt8]) throws {
        var scanner = Scanner(bytes: bytes)
        try scanner.value(depth: 0)
        scanner.skipWhitespace()
        guard scanner.index == bytes.count else { throw malformed("trailing characters after the JSON value") }
    }

    /// Validates and requires the top-level value to be an object.
    static func validateObject(_ bytes: [UInt8]) throws {
        var index = 0
        while index < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 }
        guard index < bytes.count, bytes[index] == UInt8(ascii: "{") else { throw malformed("not a JSON object") }
        try validate(bytes)
    }

    static func malformed(_ reason: String) -> JOSEError { JOSEError(.malformed, reason) }

    private struct Scanner {
        let bytes: [UInt8]
        var index = 0

        mutating func skipWhitespace() {
            while index < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 }
        }

        mutating func value(depth: Int) throws {
            guard depth <= StrictJSON.maximumDepth else { throw malformed("JSON nested too deeply") }
            skipWhitespace()
            guard index < bytes.count else { throw malformed("unexpected end of JSON") }
            switch bytes[index] {
            case UInt8(ascii: "{"): try object(depth: depth)
            case UInt8(ascii: "["): try array(depth: depth)
            case UInt8(ascii: "\""): _ = try string()
            case UInt8(ascii: "t"): try literal("true")
            case UInt8(ascii: "f"): try literal("false")
            case UInt8(ascii: "n"): try literal("null")
            default: try number()
            }
        }

        mutating func object(depth: Int) throws {
            index += 1
            var names = Set<[UInt8]>()
            skipWhitespace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
                index += 1
                return
            }
            while true {
                skipWhitespace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw malformed("expected a member name") }
                let name = try string()
                guard names.insert(name).inserted else {
                    throw malformed("duplicate member name \"\(String(decoding: name, as: UTF8.self))\"")
                }
                skipWhitespace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw malformed("expected ':'") }
                index += 1
                try value(depth: depth + 1)
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

        mutating func array(depth: Int) throws {
            index += 1
            skipWhitespace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
                index += 1
                return
            }
            while true {
                try value(depth: depth + 1)
                skipWhitespace()
                guard index < bytes.count else { throw malformed("unterminated array") }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                    continue
                }
                guard bytes[index] == UInt8(ascii: "]") else { throw malformed("expected ',' or ']'") }
                index += 1
                return
            }
        }

        /// Reads a string and returns its decoded UTF-8 bytes, so that `"a"` and `"\u0061"`
        /// count as the same member name.
        mutating func string() throws -> [UInt8] {
            index += 1
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

        mutating func literal(_ word: String) throws {
            let expected = Array(word.utf8)
            guard index + expected.count <= bytes.count, Array(bytes[index..<index + expected.count]) == expected else {
                throw malformed("invalid literal")
            }
            index += expected.count
        }

        mutating func number() throws {
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
            if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
                index += 1
                if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
                guard digits() > 0 else { throw malformed("invalid number") }
            }
        }
    }
}
