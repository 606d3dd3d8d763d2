/// Finds where plain string text ends: the first byte that is a quote, a backslash, a
/// control character or not ASCII. Reads eight bytes at a time (SWAR), since names and
/// values of JWT claims are the bulk of every identity token's claims text.
package enum PlainText {
    private static let ones: UInt64 = 0x0101_0101_0101_0101
    private static let high: UInt64 = 0x8080_8080_8080_8080
    private static let low: UInt64 = 0x7F7F_7F7F_7F7F_7F7F

    /// The index of the first byte at or after `start` that is `"`, `\`, below 0x20 or
    /// at least 0x80; `bytes.count` when there is none.
    package static func end(in bytes: UnsafeBufferPointer<UInt8>, from start: Int) -> Int {
        guard let base = bytes.baseAddress else { return start }
        let count = bytes.count
        var cursor = start
        while cursor + 8 <= count {
            let word = UInt64(littleEndian: UnsafeRawPointer(base + cursor).loadUnaligned(as: UInt64.self))
            let flags = special(word)
            if flags != 0 { return cursor + flags.trailingZeroBitCount / 8 }
            cursor += 8
        }
        while cursor < count, !isSpecial(base[cursor]) { cursor += 1 }
        return cursor
    }

    /// Whether the whole buffer is plain text (no quote, backslash, control or non-ASCII byte).
    package static func isPlain(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool { end(in: bytes, from: 0) == bytes.count }

    @inline(__always)
    package static func isSpecial(_ byte: UInt8) -> Bool {
        byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") || byte < 0x20 || byte >= 0x80
    }

    /// 0x80 in exactly the bytes of `word` that are special.
    @inline(__always)
    private static func special(_ word: UInt64) -> UInt64 {
        let seven = word & low  // every byte now at most 0x7F: no carry crosses a byte below
        let quote = ~((seven ^ (ones &* 0x22)) &+ low) & high  // 0x80 where a byte's low seven bits are 0x22
        let backslash = ~((seven ^ (ones &* 0x5C)) &+ low) & high
        let control = ~(seven &+ (ones &* 0x60)) & high  // 0x80 where the low seven bits are below 0x20
        return (word & high) | quote | backslash | control
    }
}
