import BrokerCrypto

/// The two JWS algorithms this service uses (RFC 7518 §3.3, §3.4).
///
/// - RS256 verifies Apple's identity tokens and notifications (RSA keys from `/auth/keys`).
/// - ES256 signs the `client_secret` with the team's `.p8` key.
/// Nothing else is accepted: not `none`, not HMAC, not PS256 or larger hashes.
public enum JWSAlgorithm: String, Sendable, CaseIterable {
    case rs256 = "RS256"
    case es256 = "ES256"

    /// The algorithm a key of this kind verifies with.
    public init?(for key: AsymmetricKey) {
        switch key.kind {
        case .rsa: self = .rs256
        case .ecP256: self = .es256
        }
    }

    /// Signs `signingInput` and returns the JWS signature bytes (raw `r ‖ s` for ES256).
    func sign(_ signingInput: [UInt8], with key: AsymmetricKey) throws -> [UInt8] {
        let signature = try key.signSHA256(signingInput)
        switch self {
        case .rs256: return signature
        case .es256: return try ECDSASignature.raw(fromDER: signature)
        }
    }

    /// Verifies a JWS signature. ES256 signatures must be exactly 64 bytes (RFC 7518 §3.4);
    /// they are converted to DER for OpenSSL, which checks 0 < r, s < n.
    public func verify(signature: [UInt8], signingInput: some Collection<UInt8>, key: AsymmetricKey) -> Bool {
        let signingInput = Array(signingInput)
        return signature.withUnsafeBytes { signature in
            signingInput.withUnsafeBytes { verify(signature: signature, signingInput: $0, key: key) }
        }
    }

    /// `verify(signature:signingInput:key:)` on memory the caller holds: the verifier passes
    /// the token's own bytes and a signature decoded onto the stack.
    func verify(signature: UnsafeRawBufferPointer, signingInput: UnsafeRawBufferPointer, key: AsymmetricKey) -> Bool {
        switch (self, key.kind) {
        case (.rs256, .rsa):
            return key.verifySHA256(signature: signature, message: signingInput)
        case (.es256, .ecP256):
            guard signature.count == 64, let der = try? ECDSASignature.der(fromRaw: Array(signature)) else { return false }
            return der.withUnsafeBytes { key.verifySHA256(signature: $0, message: signingInput) }
        default:
            return false
        }
    }
}
