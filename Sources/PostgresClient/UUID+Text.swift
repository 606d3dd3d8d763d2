import Foundation

extension UUID {
    private static let hexDigits = Array("0123456789abcdef".utf8)

    /// The canonical lowercase text form (`8-4-4-4-12`), as PostgreSQL prints it.
    /// Formats without `snprintf`, which Foundation's `uuidString` goes through.
    public var lowercasedString: String {
        let bytes = withUnsafeBytes(of: uuid) { Array($0) }
        return String(unsafeUninitializedCapacity: 36) { output in
            var o = 0
            for (index, byte) in bytes.enumerated() {
                if index == 4 || index == 6 || index == 8 || index == 10 {
                    output[o] = UInt8(ascii: "-")
                    o += 1
                }
                output[o] = Self.hexDigits[Int(byte >> 4)]
                output[o + 1] = Self.hexDigits[Int(byte & 0x0F)]
                o += 2
            }
            return o
        }
    }

    /// Parses the canonical text form (either case); nil for anything else.
    /// Parses without `sscanf`, which Foundation's `UUID(uuidString:)` goes through.
    public init?(canonicalText text: String) {
        var text = text
        let parsed: uuid_t? = text.withUTF8 { utf8 in
            guard utf8.count == 36, utf8[8] == UInt8(ascii: "-"), utf8[13] == UInt8(ascii: "-"),
                utf8[18] == UInt8(ascii: "-"), utf8[23] == UInt8(ascii: "-")
            else { return nil }
            var bytes = [UInt8](repeating: 0, count: 16)
            var byteIndex = 0
            var index = 0
            while index < 36 {
                if index == 8 || index == 13 || index == 18 || index == 23 {
                    index += 1
                    continue
                }
                guard let high = Self.nibble(utf8[index]), let low = Self.nibble(utf8[index + 1]) else { return nil }
                bytes[byteIndex] = high << 4 | low
                byteIndex += 1
                index += 2
            }
            return (
                bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]
            )
        }
        guard let parsed else { return nil }
        self.init(uuid: parsed)
    }

    private static func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
