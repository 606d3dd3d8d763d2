import BrokerCrypto
import Locking
import StrictJSON
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// The protected header of a JWS, as far as this service reads it. Immutable; a class, so
/// the verifier's cache and every verified token share one copy (passing it on is one
/// reference count, not one per member).
public final class JWSHeader: Sendable {
    public let algorithm: String
    public let keyID: String?
    public let type: String?
    /// Every member, for callers that need more.
    public let members: [String: JSONValue]
    /// `algorithm` when it names one this library knows; read once with the header, which
    /// the verifier's cache keeps, rather than on every token.
    let knownAlgorithm: JWSAlgorithm?
    /// Whether the header has `crit` (refused: no extension is implemented).
    let hasCritical: Bool

    init(algorithm: String, keyID: String?, type: String?, members: [String: JSONValue]) {
        self.algorithm = algorithm
        self.keyID = keyID
        self.type = type
        self.members = members
        knownAlgorithm = JWSAlgorithm(rawValue: algorithm)
        hasCritical = members["crit"] != nil
    }
}

/// A JWS whose signature has been verified: its header and payload can be trusted.
public struct VerifiedJWS: Sendable {
    public let header: JWSHeader
    public let payload: [UInt8]
    /// The key that verified it.
    public let keyID: String?

    /// The payload as a JSON object (JWT claims), with duplicate member names refused.
    /// - Throws: `JOSEError.malformed`.
    public func claims() throws -> [String: JSONValue] {
        try JOSEError.parsingObject(payload)
    }
}

/// Verifies compact JWS (RFC 7515 §7.1), safely by construction:
///
/// - the algorithm comes from the trusted key; the header's `alg` must merely agree with it,
///   so `none`, HMAC-with-the-public-key and RS/ES confusion cannot work;
/// - `crit` is refused (we implement no extensions); `jku`, `x5u`, `jwk` and `x5c` are never
///   followed: keys come only from the caller;
/// - tokens over `maximumBytes` are refused before any decoding;
/// - base64url must be canonical and unpadded, header and claims JSON objects without
///   duplicate member names.
public struct JWSVerifier: Sendable {
    /// Largest token accepted (default 16 KiB).
    public var maximumBytes: Int = 16 * 1024
    /// Algorithms accepted at all.
    public var allowedAlgorithms: Set<JWSAlgorithm> = [.rs256, .es256]
    private let headers = JWSHeaderCache()

    public init(maximumBytes: Int = 16 * 1024, allowedAlgorithms: Set<JWSAlgorithm> = [.rs256, .es256]) {
        self.maximumBytes = maximumBytes
        self.allowedAlgorithms = allowedAlgorithms
    }

    /// Verifies with the key whose `kid` the header names; a header without `kid` is refused.
    public func verify(_ token: String, keys: JWKSet) throws -> VerifiedJWS {
        try verify(token) { header in
            guard let keyID = header.keyID else { throw JOSEError(.keyNotFound, "the header has no kid") }
            guard let key = keys.verificationKey(keyID: keyID) else {
                throw JOSEError(.keyNotFound, "no trusted key has kid \(keyID)")
            }
            return key
        }
    }

    /// Verifies with one trusted key, whatever the header's `kid`.
    public func verify(_ token: String, key: JWK) throws -> VerifiedJWS {
        try verify(token) { _ in key }
    }

    /// Parses once, lets `selectKey` choose a trusted key from the (not yet verified)
    /// header, and verifies with it. `selectKey` may throw its own errors (an unknown kid).
    public func verify(_ token: String, selectKey: (JWSHeader) throws -> JWK) throws -> VerifiedJWS {
        try Self.withParts(of: token, maximumBytes: maximumBytes) { parts in
            // Every part must be well-formed before a key is chosen, so a malformed token is
            // called malformed whatever its kid; the payload array is kept on success.
            guard let payload = Base64URL.decode(buffer: parts.encodedPayload),
                let signatureCount = Base64URL.decodedCount(encodedCount: parts.encodedSignature.count)
            else { throw JOSEError.notBase64URL }
            // The signature is only read here: decode it onto the stack, not into an array.
            return try withUnsafeTemporaryAllocation(of: UInt8.self, capacity: signatureCount) { signature in
                guard Base64URL.decode(buffer: parts.encodedSignature, into: signature) else { throw JOSEError.notBase64URL }
                let header = try parts.header(cache: headers)
                try check(header)
                let key = try selectKey(header)
                guard key.canVerify else { throw JOSEError(.keyNotFound, "the key may not verify signatures") }
                guard let algorithm = key.algorithm, allowedAlgorithms.contains(algorithm) else {
                    throw JOSEError(.keyNotFound, "the key has no accepted algorithm")
                }
                guard algorithm == header.knownAlgorithm else {
                    throw JOSEError(
                        .algorithmMismatch, "header alg \(header.algorithm) does not match the key's \(algorithm.rawValue)")
                }
                let signingInput = UnsafeRawBufferPointer(parts.signingInput)
                guard algorithm.verify(signature: UnsafeRawBufferPointer(signature), signingInput: signingInput, key: key.key)
                else {
                    throw JOSEError(.signatureInvalid, "the signature does not verify")
                }
                return VerifiedJWS(header: header, payload: payload, keyID: key.keyID)
            }
        }
    }

    /// The header of a compact JWS, decoded but **not verified**: only for choosing which
    /// trusted key to verify it with (as a server picks the team key named by `kid`).
    public func unverifiedHeader(_ token: String) throws -> JWSHeader {
        try Self.withParts(of: token, maximumBytes: maximumBytes) { try $0.header(cache: nil) }
    }

    private func check(_ header: JWSHeader) throws {
        guard !header.hasCritical else {
            throw JOSEError(.unsupportedCritical, "critical header extensions are not supported")
        }
        guard let algorithm = header.knownAlgorithm, allowedAlgorithms.contains(algorithm) else {
            throw JOSEError(.unsupportedAlgorithm, "algorithm \(header.algorithm) is not accepted")
        }
    }

    /// Splits `token` into its three encoded parts, read in place from the token's own UTF-8
    /// storage (no copy: this runs for every login), and hands them to `body`.
    private static func withParts<T>(of token: String, maximumBytes: Int, _ body: (Parts) throws -> T) throws -> T {
        guard token.utf8.count <= maximumBytes else {
            throw JOSEError(.tooLarge, "the token exceeds \(maximumBytes) bytes")
        }
        var token = token
        return try token.withUTF8 { try body(Parts(splitting: $0)) }
    }

    /// The three encoded parts of a compact JWS, pointing into the token's bytes (valid only
    /// inside `withParts`).
    struct Parts {
        let encodedHeader: UnsafeBufferPointer<UInt8>
        let encodedPayload: UnsafeBufferPointer<UInt8>
        let encodedSignature: UnsafeBufferPointer<UInt8>
        /// `header.payload`, what the signature covers.
        let signingInput: UnsafeBufferPointer<UInt8>

        init(splitting utf8: UnsafeBufferPointer<UInt8>) throws {
            guard let firstDot = Self.dot(in: utf8, from: 0), let secondDot = Self.dot(in: utf8, from: firstDot + 1),
                Self.dot(in: utf8, from: secondDot + 1) == nil
            else { throw JOSEError(.malformed, "a compact JWS has three dot-separated parts") }
            guard firstDot > 0 else { throw JOSEError(.malformed, "the header is empty") }
            encodedHeader = UnsafeBufferPointer(rebasing: utf8[..<firstDot])
            encodedPayload = UnsafeBufferPointer(rebasing: utf8[(firstDot + 1)..<secondDot])
            encodedSignature = UnsafeBufferPointer(rebasing: utf8[(secondDot + 1)...])
            signingInput = UnsafeBufferPointer(rebasing: utf8[..<secondDot])
        }

        /// The index of the next "." at or after `start` (memchr: a token is ~1 KB to scan).
        private static func dot(in buffer: UnsafeBufferPointer<UInt8>, from start: Int) -> Int? {
            guard start < buffer.count, let base = buffer.baseAddress,
                let found = memchr(base + start, Int32(UInt8(ascii: ".")), buffer.count - start)
            else { return nil }
            return UnsafeRawPointer(found) - UnsafeRawPointer(base)
        }

        /// The decoded header, from `cache` when it holds these exact bytes.
        func header(cache: JWSHeaderCache?) throws -> JWSHeader {
            if let known = cache?.header(for: encodedHeader) { return known }
            guard let bytes = Base64URL.decode(buffer: encodedHeader) else { throw JOSEError.notBase64URL }
            let members = try JOSEError.parsingObject(bytes)
            guard let algorithm = members["alg"]?.stringValue else {
                throw JOSEError(.malformed, "the header lacks a string alg")
            }
            if let kid = members["kid"], kid.stringValue == nil { throw JOSEError(.malformed, "kid is not a string") }
            let header = JWSHeader(
                algorithm: algorithm, keyID: members["kid"]?.stringValue, type: members["typ"]?.stringValue,
                members: members)
            cache?.remember(header, for: encodedHeader)
            return header
        }
    }
}

/// The last few headers a verifier decoded, by their exact encoded bytes. An issuer signs
/// every token with one of a handful of headers (`{"kid":…,"alg":"RS256"}`), so decoding
/// and parsing it again for each token is waste on the hottest path; a header that is not
/// byte-for-byte one of these is decoded as usual, so the cache cannot change a verdict.
final class JWSHeaderCache: Sendable {
    private static let capacity = 8
    private static let maximumEncodedBytes = 512
    private struct Entry {
        var encoded: [UInt8]
        var header: JWSHeader
    }
    private let entries = Lock<(items: [Entry], next: Int)>(([], 0))

    func header(for candidate: UnsafeBufferPointer<UInt8>) -> JWSHeader? {
        entries.withLock { state in
            state.items.first { entry in
                entry.encoded.count == candidate.count
                    && entry.encoded.withUnsafeBytes { memcmp($0.baseAddress!, candidate.baseAddress!, candidate.count) == 0 }
            }?.header
        }
    }

    func remember(_ header: JWSHeader, for encoded: UnsafeBufferPointer<UInt8>) {
        guard encoded.count <= Self.maximumEncodedBytes else { return }
        entries.withLock { state in
            let entry = Entry(encoded: Array(encoded), header: header)
            if state.items.count < Self.capacity {
                state.items.append(entry)
            } else {
                state.items[state.next] = entry
                state.next = (state.next + 1) % Self.capacity
            }
        }
    }
}

/// Signs compact JWS with a private key; the algorithm follows from the key.
public struct JWSSigner: Sendable {
    public let key: AsymmetricKey
    public let algorithm: JWSAlgorithm
    public let keyID: String?

    public init(key: AsymmetricKey, keyID: String?) throws {
        guard key.hasPrivateKey, let algorithm = JWSAlgorithm(for: key) else {
            throw JOSEError(.invalidKey, "signing needs an RSA or P-256 private key")
        }
        self.key = key
        self.algorithm = algorithm
        self.keyID = keyID
    }

    /// A compact JWS of `payload` with header `{"alg":…,"kid":…}` plus `extraHeader`.
    public func sign(payload: [UInt8], extraHeader: [String: JSONValue] = [:]) throws -> String {
        var header = extraHeader
        header["alg"] = .string(algorithm.rawValue)
        if let keyID { header["kid"] = .string(keyID) }
        let signingInput = Base64URL.encode(JSONValue.object(header).serialized()) + "." + Base64URL.encode(payload)
        let signature = try algorithm.sign(Array(signingInput.utf8), with: key)
        return signingInput + "." + Base64URL.encode(signature)
    }

    /// A JWT: `claims` as the JSON payload.
    public func sign(claims: [String: JSONValue], extraHeader: [String: JSONValue] = [:]) throws -> String {
        try sign(payload: JSONValue.object(claims).serialized(), extraHeader: extraHeader)
    }
}
