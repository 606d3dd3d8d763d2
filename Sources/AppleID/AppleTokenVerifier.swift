import BrokerCrypto
import Foundation
import JOSE
import StrictJSON

/// Why an Apple-signed JWT (identity token or notification) was refused. `code`'s raw value
/// is the problem code the API answers with.
public struct TokenRejection: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: String, Sendable, CaseIterable {
        case tokenMalformed = "token_malformed"
        case tokenSignatureInvalid = "token_signature_invalid"
        case unknownKey = "unknown_key"
        case tokenIssuerInvalid = "token_issuer_invalid"
        case tokenAudienceInvalid = "token_audience_invalid"
        case tokenExpired = "token_expired"
        case tokenNotYetValid = "token_not_yet_valid"
        case tokenTooOld = "token_too_old"
        case nonceMismatch = "nonce_mismatch"
        case nonceMissing = "nonce_missing"
    }

    public let code: Code
    public let detail: String

    public init(_ code: Code, _ detail: String) {
        self.code = code
        self.detail = detail
    }

    public var description: String { "\(code.rawValue): \(detail)" }

    package static func malformed(_ detail: String) -> TokenRejection { TokenRejection(.tokenMalformed, detail) }
}

/// Verifies the signature of a JWT Apple signed (identity tokens, server-to-server
/// notifications): RS256 only, with the key Apple publishes under the header's `kid`
/// (one refetch of `/auth/keys` for an unknown kid), then parses the claims as a JSON
/// object without duplicate names.
public struct AppleTokenVerifier: Sendable {
    public let keys: any AppleKeyProvider
    /// Whose refetch budget an unknown kid spends (`AppleKeySource`).
    public var source: AppleKeySource = .login
    private let verifier = JWSVerifier(maximumBytes: 16 * 1024, allowedAlgorithms: [.rs256])

    public init(keys: any AppleKeyProvider, source: AppleKeySource = .login) {
        self.keys = keys
        self.source = source
    }

    /// The verified claims.
    /// - Throws: `TokenRejection` (`token_malformed`, `token_signature_invalid`,
    ///   `unknown_key`) or `AppleKeyError.unavailable` when Apple's keys cannot be had.
    public func verify(_ token: String) throws -> [String: JSONValue] {
        try verify(token) { try $0.claims() }
    }

    /// The verified claims, as Apple's claim rules read them (`now` in seconds since 1970).
    /// - Throws: as `verify(_:)`.
    package func claims(of token: String, leeway: TimeInterval, now: TimeInterval) throws -> AppleClaims {
        try verify(token) { try AppleClaims(payload: $0.payload, leeway: leeway, now: now) }
    }

    private func verify<Claims>(_ token: String, read: (VerifiedJWS) throws -> Claims) throws -> Claims {
        do {
            return try read(
                verifier.verify(token) { header in
                    guard let keyID = header.keyID else { throw TokenRejection.malformed("the header has no kid") }
                    do {
                        return try keys.key(id: keyID, source: source)
                    } catch AppleKeyError.unknownKey {
                        throw TokenRejection(.unknownKey, "Apple publishes no key with this kid")
                    }
                })
        } catch let error as JOSEError {
            switch error.code {
            case .signatureInvalid, .algorithmMismatch, .keyNotFound:
                throw TokenRejection(.tokenSignatureInvalid, "the signature does not verify with Apple's key")
            default:
                throw TokenRejection.malformed(error.reason)
            }
        }
    }
}
