import COpenSSL

/// A failure inside the crypto layer, with a stable `code` and OpenSSL's reason when there is one.
public struct CryptoError: Error, Hashable, Sendable, CustomStringConvertible {
    /// Stable, machine-readable error codes.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        init(_ name: String) { self.name = name }
        public var description: String { name }

        /// A key could not be built from the material given (bad PEM, bad JWK numbers, wrong curve).
        public static let invalidKey = Code("invalid_key")
        /// Input of the wrong size or shape (IV, tag, key length, signature encoding).
        public static let invalidInput = Code("invalid_input")
        /// Authenticated decryption failed: wrong key, tampered ciphertext or associated data.
        public static let authenticationFailed = Code("authentication_failed")
        /// OpenSSL reported an internal failure.
        public static let internalError = Code("openssl_error")
    }

    public let code: Code
    public let reason: String

    public init(_ code: Code, _ reason: String) {
        self.code = code
        self.reason = reason
    }

    public var description: String { "CryptoError.\(code): \(reason)" }

    /// Builds an error from OpenSSL's thread-local error queue and clears it, so a
    /// stale entry never surfaces in a later, unrelated call.
    static func openSSL(_ code: Code, _ context: String) -> CryptoError {
        let first = ERR_get_error()
        ERR_clear_error()
        guard first != 0 else { return CryptoError(code, context) }
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(first, &buffer, buffer.count)
        return CryptoError(
            code, "\(context): \(String(decoding: buffer.prefix(while: { $0 != 0 }).map(UInt8.init(bitPattern:)), as: UTF8.self))"
        )
    }
}
