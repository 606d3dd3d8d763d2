import StrictJSON

/// Why a JWS, JWK or JWK Set was refused, with a stable code.
public struct JOSEError: Error, Hashable, Sendable, CustomStringConvertible {
    /// Stable, machine-readable codes.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        init(_ name: String) { self.name = name }
        public var description: String { name }

        /// Not a compact JWS / JWK of the expected shape: wrong number of parts, bad
        /// base64url, JSON that is not an object, duplicate JSON member names.
        public static let malformed = Code("malformed")
        /// Larger than the configured limit; refused before any parsing.
        public static let tooLarge = Code("too_large")
        /// `alg` is `none`, an HMAC, or anything else this verifier does not accept.
        public static let unsupportedAlgorithm = Code("unsupported_algorithm")
        /// The header's `alg` is not the algorithm of the key selected to verify it.
        public static let algorithmMismatch = Code("algorithm_mismatch")
        /// The header has `crit`, whose extensions this verifier does not understand.
        public static let unsupportedCritical = Code("unsupported_critical_header")
        /// No trusted key matches the header's `kid` (or the header has no `kid`).
        public static let keyNotFound = Code("key_not_found")
        /// The signature does not verify.
        public static let signatureInvalid = Code("signature_invalid")
        /// A JWK cannot be used: unsupported type or curve, weak or malformed key material.
        public static let invalidKey = Code("invalid_key")
    }

    public let code: Code
    public let reason: String

    public init(_ code: Code, _ reason: String) {
        self.code = code
        self.reason = reason
    }

    public var description: String { "JOSEError.\(code): \(reason)" }
}

extension JOSEError {
    /// A part of a compact JWS is not canonical unpadded base64url.
    static let notBase64URL = JOSEError(.malformed, "a part is not canonical unpadded base64url")

    /// Parses a strict JSON object, reporting failure as `malformed`.
    static func parsingObject(_ bytes: [UInt8]) throws -> [String: JSONValue] {
        try parsing { try JSONValue.parseObject(bytes) }
    }

    /// Runs a strict JSON parse, reporting failure as `malformed`.
    static func parsing<T>(_ parse: () throws -> T) throws -> T {
        do {
            return try parse()
        } catch let error as JSONParseError {
            throw JOSEError(.malformed, error.reason)
        }
    }
}
