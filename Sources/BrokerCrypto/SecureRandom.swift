import COpenSSL

/// Cryptographically secure random bytes from OpenSSL's DRBG.
public enum SecureRandom {
    public static func bytes(_ count: Int) -> [UInt8] {
        var output = [UInt8](repeating: 0, count: count)
        guard count > 0 else { return output }
        let ok = RAND_bytes(&output, Int32(count))
        precondition(ok == 1, "RAND_bytes failed: the system has no entropy source")
        return output
    }
}

/// Comparisons whose time does not depend on where the inputs differ.
public enum ConstantTime {
    /// True when both have the same length and bytes. Length is not secret.
    public static func equals(_ lhs: [UInt8], _ rhs: [UInt8]) -> Bool {
        guard lhs.count == rhs.count else { return false }
        guard !lhs.isEmpty else { return true }
        return lhs.withUnsafeBytes { a in
            rhs.withUnsafeBytes { b in CRYPTO_memcmp(a.baseAddress, b.baseAddress, a.count) == 0 }
        }
    }
}
