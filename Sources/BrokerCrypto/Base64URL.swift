/// base64url without padding (RFC 4648 §5, as JOSE uses it, RFC 7515 §2).
///
/// Decoding is strict: padding, whitespace, characters outside the URL-safe alphabet and
/// non-zero trailing bits are all rejected, so each byte string has exactly one encoding.
/// Both directions work on contiguous bytes with plain loops: they run several times per
/// login and must not cost more than the signature check.
public enum Base64URL {
    private static let alphabet: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
    private static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (index, character) in alphabet.enumerated() { table[Int(character)] = UInt8(index) }
        return table
    }()

    public static func encode(_ bytes: [UInt8]) -> String {
        bytes.withUnsafeBufferPointer { encode(buffer: $0) }
    }

    public static func encode(_ bytes: ArraySlice<UInt8>) -> String {
        bytes.withUnsafeBufferPointer { encode(buffer: $0) }
    }

    public static func encode(_ string: String) -> String { encode(Array(string.utf8)) }

    private static func encode(buffer input: UnsafeBufferPointer<UInt8>) -> String {
        let count = input.count
        let outputCount = (count * 4 + 2) / 3
        return String(unsafeUninitializedCapacity: outputCount) { output in
            alphabet.withUnsafeBufferPointer { table in
                var i = 0
                var o = 0
                while i + 3 <= count {
                    let value = UInt32(input[i]) << 16 | UInt32(input[i + 1]) << 8 | UInt32(input[i + 2])
                    output[o] = table[Int(value >> 18 & 0x3F)]
                    output[o + 1] = table[Int(value >> 12 & 0x3F)]
                    output[o + 2] = table[Int(value >> 6 & 0x3F)]
                    output[o + 3] = table[Int(value & 0x3F)]
                    i += 3
                    o += 4
                }
                let rest = count - i
                if rest > 0 {
                    let value = UInt32(input[i]) << 16 | (rest == 2 ? UInt32(input[i + 1]) << 8 : 0)
                    output[o] = table[Int(value >> 18 & 0x3F)]
                    output[o + 1] = table[Int(value >> 12 & 0x3F)]
                    o += 2
                    if rest == 2 {
                        output[o] = table[Int(value >> 6 & 0x3F)]
                        o += 1
                    }
                }
                return o
            }
        }
    }

    /// Decodes; nil for anything that is not canonical unpadded base64url.
    public static func decode(_ text: String) -> [UInt8]? {
        var text = text
        return text.withUTF8 { decode(buffer: $0) }
    }

    public static func decode(_ text: Substring) -> [UInt8]? { decode(String(text)) }

    public static func decode(utf8 input: [UInt8]) -> [UInt8]? {
        input.withUnsafeBufferPointer { decode(buffer: $0) }
    }

    public static func decode(utf8 input: ArraySlice<UInt8>) -> [UInt8]? {
        input.withUnsafeBufferPointer { decode(buffer: $0) }
    }

    public static func decode(buffer input: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        guard let outputCount = decodedCount(encodedCount: input.count) else { return nil }
        var valid = true
        let output = [UInt8](unsafeUninitializedCapacity: outputCount) { output, initialized in
            valid = decode(buffer: input, into: output)
            initialized = valid ? outputCount : 0
        }
        return valid ? output : nil
    }

    /// How many bytes `encodedCount` characters decode to; nil when no canonical unpadded
    /// encoding has that length.
    public static func decodedCount(encodedCount count: Int) -> Int? {
        count % 4 == 1 ? nil : count / 4 * 3 + (count % 4 == 0 ? 0 : count % 4 - 1)
    }

    /// Decodes into `output`, which must hold exactly `decodedCount(encodedCount: input.count)`
    /// bytes; false for anything that is not canonical unpadded base64url. For a caller that
    /// decodes into memory of its own (a signature onto the stack) instead of a new array.
    public static func decode(buffer input: UnsafeBufferPointer<UInt8>, into output: UnsafeMutableBufferPointer<UInt8>) -> Bool {
        let count = input.count
        guard decodedCount(encodedCount: count) == output.count else { return false }
        return values.withUnsafeBufferPointer { table in
            var i = 0
            var o = 0
            while i + 4 <= count {
                let a = table[Int(input[i])]
                let b = table[Int(input[i + 1])]
                let c = table[Int(input[i + 2])]
                let d = table[Int(input[i + 3])]
                if (a | b | c | d) & 0x80 != 0 { return false }
                let value = UInt32(a) << 18 | UInt32(b) << 12 | UInt32(c) << 6 | UInt32(d)
                output[o] = UInt8(truncatingIfNeeded: value >> 16)
                output[o + 1] = UInt8(truncatingIfNeeded: value >> 8)
                output[o + 2] = UInt8(truncatingIfNeeded: value)
                i += 4
                o += 3
            }
            let rest = count - i
            guard rest > 0 else { return true }
            let a = table[Int(input[i])]
            let b = table[Int(input[i + 1])]
            let c = rest == 3 ? table[Int(input[i + 2])] : 0
            if (a | b | c) & 0x80 != 0 { return false }
            let value = UInt32(a) << 18 | UInt32(b) << 12 | UInt32(c) << 6
            output[o] = UInt8(truncatingIfNeeded: value >> 16)
            // Leftover bits must be zero (RFC 4648 §3.5 canonical encoding).
            if rest == 2 { return value & 0xFFFF == 0 }
            output[o + 1] = UInt8(truncatingIfNeeded: value >> 8)
            return value & 0xFF == 0
        }
    }
}
