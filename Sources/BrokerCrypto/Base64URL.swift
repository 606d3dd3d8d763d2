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
    /// For each position in a group of four characters, the character's six bits already
    /// shifted into place in the 24-bit group, or `invalidBit` for a character outside
    /// the alphabet: a group is four loads and three ORs.
    private static let shiftedValues: [UInt32] = (0..<4).flatMap { position in
        values.map { $0 == 0xFF ? invalidBit : UInt32($0) << (6 * (3 - position)) }
    }
    private static let invalidBit: UInt32 = 1 << 31

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
        guard count > 0, let source = input.baseAddress, let start = output.baseAddress else { return true }
        return shiftedValues.withUnsafeBufferPointer { tables in
            let first = tables.baseAddress!, second = first + 256, third = first + 512, fourth = first + 768
            // Declared inside the closure: a captured variable lives in memory, and every
            // byte stored could alias it, so the loop reloaded and rewrote it each group.
            var target = start
            // OR every group together and test `invalidBit` once at the end, so the loop
            // has no branch but its own.
            var invalid: UInt32 = 0
            var i = 0
            let whole = count & ~3
            while i < whole {
                let value = first[Int(source[i])] | second[Int(source[i + 1])] | third[Int(source[i + 2])] | fourth[Int(source[i + 3])]
                invalid |= value
                target[0] = UInt8(truncatingIfNeeded: value >> 16)
                target[1] = UInt8(truncatingIfNeeded: value >> 8)
                target[2] = UInt8(truncatingIfNeeded: value)
                target += 3
                i += 4
            }
            let rest = count - i
            if rest > 0 {
                let value = first[Int(source[i])] | second[Int(source[i + 1])] | (rest == 3 ? third[Int(source[i + 2])] : 0)
                invalid |= value
                target[0] = UInt8(truncatingIfNeeded: value >> 16)
                // Leftover bits must be zero (RFC 4648 §3.5 canonical encoding).
                if rest == 2 {
                    if value & 0xFFFF != 0 { return false }
                } else {
                    target[1] = UInt8(truncatingIfNeeded: value >> 8)
                    if value & 0xFF != 0 { return false }
                }
            }
            return invalid & Self.invalidBit == 0
        }
    }
}
