import COpenSSL

/// Converts ECDSA P-256 signatures between JWS's fixed-size `r ‖ s` (RFC 7518 §3.4,
/// IEEE P1363) and the ASN.1 DER `SEQUENCE { r, s }` OpenSSL signs and verifies.
public enum ECDSASignature {
    /// Byte length of each of r and s for P-256.
    public static let p256CoordinateByteCount = 32

    /// DER from raw `r ‖ s`; anything but exactly 64 bytes is rejected.
    public static func der(fromRaw raw: [UInt8]) throws -> [UInt8] {
        let width = p256CoordinateByteCount
        guard raw.count == 2 * width else {
            throw CryptoError(.invalidInput, "ES256 signature must be \(2 * width) bytes, got \(raw.count)")
        }
        guard let signature = ECDSA_SIG_new() else { throw CryptoError.openSSL(.internalError, "ECDSA_SIG_new") }
        defer { ECDSA_SIG_free(signature) }
        let r = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, Int32(width), nil) }
        let s = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + width, Int32(width), nil) }
        guard let r, let s else {
            if let r { BN_free(r) }
            if let s { BN_free(s) }
            throw CryptoError.openSSL(.internalError, "BN_bin2bn")
        }
        // ECDSA_SIG_set0 takes ownership of r and s only when it succeeds.
        guard ECDSA_SIG_set0(signature, r, s) == 1 else {
            BN_free(r)
            BN_free(s)
            throw CryptoError.openSSL(.internalError, "ECDSA_SIG_set0")
        }
        var output: UnsafeMutablePointer<UInt8>? = nil
        let length = i2d_ECDSA_SIG(signature, &output)
        guard length > 0, let output else { throw CryptoError.openSSL(.internalError, "i2d_ECDSA_SIG") }
        defer { CRYPTO_free(output, #fileID, #line) }
        return Array(UnsafeBufferPointer(start: output, count: Int(length)))
    }

    /// Raw `r ‖ s` (64 bytes) from DER.
    public static func raw(fromDER der: [UInt8]) throws -> [UInt8] {
        let width = p256CoordinateByteCount
        let parsed: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, buffer.count)
        }
        guard let parsed else { throw CryptoError.openSSL(.invalidInput, "not a DER ECDSA signature") }
        defer { ECDSA_SIG_free(parsed) }
        var r: OpaquePointer? = nil
        var s: OpaquePointer? = nil
        ECDSA_SIG_get0(parsed, &r, &s)
        guard let r, let s, BN_num_bits(r) <= Int32(width * 8), BN_num_bits(s) <= Int32(width * 8) else {
            throw CryptoError(.invalidInput, "ECDSA r or s too large for P-256")
        }
        var output = [UInt8](repeating: 0, count: 2 * width)
        output.withUnsafeMutableBufferPointer { buffer in
            _ = BN_bn2binpad(r, buffer.baseAddress, Int32(width))
            _ = BN_bn2binpad(s, buffer.baseAddress! + width, Int32(width))
        }
        return output
    }
}
