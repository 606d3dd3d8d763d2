import COpenSSL

/// OpenSSL algorithm implementations fetched once. OpenSSL 3 otherwise looks the
/// implementation up in its provider tables on every call (`EVP_sha256()` is such an
/// implicit fetch), which costs more than hashing a token.
enum FetchedAlgorithms {
    /// A fetched `EVP_MD` is immutable and may be shared by threads (OpenSSL 3 threading docs).
    nonisolated(unsafe) static let sha256: OpaquePointer = {
        guard let digest = EVP_MD_fetch(nil, "SHA2-256", nil) else { fatalError("OpenSSL has no SHA-256") }
        return digest
    }()
}

/// SHA-256 through OpenSSL's EVP interface.
public enum SHA256 {
    public static let byteCount = 32

    /// The SHA-256 digest of `bytes`.
    public static func hash(_ bytes: some Collection<UInt8>) -> [UInt8] {
        withContiguousBytes(bytes) { hash($0.assumingMemoryBound(to: UInt8.self)) }
    }

    /// The SHA-256 digest of `bytes`; not generic, so a hot caller in another module pays
    /// no runtime generic-metadata lookup.
    public static func hash(_ bytes: UnsafeBufferPointer<UInt8>) -> [UInt8] {
        var length: UInt32 = 0
        let output = [UInt8](unsafeUninitializedCapacity: byteCount) { buffer, initialized in
            let ok = EVP_Digest(bytes.baseAddress, bytes.count, buffer.baseAddress, &length, FetchedAlgorithms.sha256, nil)
            precondition(ok == 1 && length == 32, "EVP_Digest(SHA-256) failed")
            initialized = byteCount
        }
        return output
    }

    /// The SHA-256 digest of a string's UTF-8 bytes.
    public static func hash(_ string: String) -> [UInt8] { hash(Array(string.utf8)) }

    /// Lowercase hexadecimal SHA-256 of a string's UTF-8 bytes (Apple's nonce convention).
    public static func hexHash(_ string: String) -> String { Hex.encode(hash(string)) }
}

/// HMAC-SHA-256 (RFC 2104) through OpenSSL.
public enum HMACSHA256 {
    public static func authenticate(_ message: some Collection<UInt8>, key: some Collection<UInt8>) -> [UInt8] {
        var output = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let result = withContiguousBytes(key) { keyBytes in
            withContiguousBytes(message) { messageBytes in
                HMAC(
                    EVP_sha256(), keyBytes.baseAddress, Int32(keyBytes.count),
                    messageBytes.baseAddress?.assumingMemoryBound(to: UInt8.self), messageBytes.count,
                    &output, &length)
            }
        }
        precondition(result != nil && length == 32, "HMAC(SHA-256) failed")
        return output
    }
}

/// Lowercase hexadecimal encoding.
public enum Hex {
    private static let digits = Array("0123456789abcdef".utf8)

    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        var text = [UInt8]()
        text.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// Decodes upper- or lowercase hex; nil for odd length or a non-hex character.
    public static func decode(_ text: some StringProtocol) -> [UInt8]? {
        let utf8 = Array(text.utf8)
        guard utf8.count % 2 == 0 else { return nil }
        var bytes = [UInt8]()
        bytes.reserveCapacity(utf8.count / 2)
        var index = 0
        while index < utf8.count {
            guard let high = nibble(utf8[index]), let low = nibble(utf8[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
            index += 2
        }
        return bytes
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

/// Runs `body` over the bytes of any collection, copying only when it is not contiguous.
@inline(__always)
func withContiguousBytes<R>(
    _ bytes: some Collection<UInt8>, _ body: (UnsafeRawBufferPointer) throws -> R
) rethrows -> R {
    if let result = try bytes.withContiguousStorageIfAvailable({ try body(UnsafeRawBufferPointer($0)) }) {
        return result
    }
    return try Array(bytes).withUnsafeBytes(body)
}
