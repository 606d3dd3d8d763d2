import COpenSSL
import Glibc
import Locking
import Synchronization

/// An RSA or EC P-256 key held in an OpenSSL `EVP_PKEY`, freed when the last reference goes.
///
/// OpenSSL allows concurrent read-only use of one `EVP_PKEY` (each operation makes its own
/// context), which is what `sign` and `verify` do, so a key may be shared across threads.
public final class AsymmetricKey: @unchecked Sendable {
    /// The algorithm family and size of a key.
    public enum Kind: Hashable, Sendable, CustomStringConvertible {
        case rsa(bits: Int)
        case ecP256

        public var description: String {
            switch self {
            case .rsa(let bits): "RSA-\(bits)"
            case .ecP256: "EC P-256"
            }
        }
    }

    let pointer: OpaquePointer
    /// Verification contexts, initialised once and reused (one per concurrent caller).
    private let verifyContexts = Lock<[VerifyContext]>([])
    /// RSA (with its modulus size) or EC P-256.
    public let kind: Kind
    /// Whether the private half is present (only then can it `sign`).
    public let hasPrivateKey: Bool

    // EVP_PKEY selections (openssl/core_dispatch.h); the C macros are expressions Swift cannot import.
    private static let selectPublicKey: Int32 = 0x86
    private static let selectKeyPair: Int32 = 0x87

    /// Takes ownership of `pointer`; rejects anything but RSA and EC P-256.
    init(takingOwnershipOf pointer: OpaquePointer, hasPrivateKey: Bool) throws {
        self.pointer = pointer
        if EVP_PKEY_is_a(pointer, "RSA") == 1 {
            kind = .rsa(bits: Int(EVP_PKEY_get_bits(pointer)))
        } else if EVP_PKEY_is_a(pointer, "EC") == 1 {
            var name = [CChar](repeating: 0, count: 64)
            var length = 0
            guard EVP_PKEY_get_utf8_string_param(pointer, "group", &name, name.count, &length) == 1 else {
                EVP_PKEY_free(pointer)
                throw CryptoError.openSSL(.invalidKey, "EC key without a named curve")
            }
            let curve = String(decoding: name.prefix(length).map(UInt8.init(bitPattern:)), as: UTF8.self)
            guard curve == "prime256v1" || curve == "P-256" else {
                EVP_PKEY_free(pointer)
                throw CryptoError(.invalidKey, "EC curve \(curve) is not P-256")
            }
            kind = .ecP256
        } else {
            EVP_PKEY_free(pointer)
            throw CryptoError(.invalidKey, "only RSA and EC P-256 keys are supported")
        }
        self.hasPrivateKey = hasPrivateKey
    }

    deinit { EVP_PKEY_free(pointer) }

    // MARK: Construction

    /// An RSA public key from its big-endian modulus and exponent.
    public static func rsaPublicKey(modulus: [UInt8], exponent: [UInt8]) throws -> AsymmetricKey {
        let modulus = Array(modulus.drop(while: { $0 == 0 }))
        guard !modulus.isEmpty, !exponent.isEmpty else { throw CryptoError(.invalidKey, "empty RSA modulus or exponent") }
        let pointer = try fromData(type: "RSA", selection: selectPublicKey) { parameters in
            try parameters.push(bignum: modulus, name: "n")
            try parameters.push(bignum: exponent, name: "e")
        }
        return try AsymmetricKey(takingOwnershipOf: pointer, hasPrivateKey: false)
    }

    /// An RSA private key from its CRT components (RFC 7518 §6.3.2 names: n, e, d, p, q, dp, dq, qi).
    public static func rsaPrivateKey(
        modulus: [UInt8], publicExponent: [UInt8], privateExponent: [UInt8], prime1: [UInt8], prime2: [UInt8],
        exponent1: [UInt8], exponent2: [UInt8], coefficient: [UInt8]
    ) throws -> AsymmetricKey {
        let pointer = try fromData(type: "RSA", selection: selectKeyPair) { parameters in
            try parameters.push(bignum: modulus, name: "n")
            try parameters.push(bignum: publicExponent, name: "e")
            try parameters.push(bignum: privateExponent, name: "d")
            try parameters.push(bignum: prime1, name: "rsa-factor1")
            try parameters.push(bignum: prime2, name: "rsa-factor2")
            try parameters.push(bignum: exponent1, name: "rsa-exponent1")
            try parameters.push(bignum: exponent2, name: "rsa-exponent2")
            try parameters.push(bignum: coefficient, name: "rsa-coefficient1")
        }
        let key = try AsymmetricKey(takingOwnershipOf: pointer, hasPrivateKey: true)
        try key.check(publicOnly: false)
        return key
    }

    /// An EC P-256 public key from its affine coordinates (32 bytes each), checked to be on the curve.
    public static func p256PublicKey(x: [UInt8], y: [UInt8]) throws -> AsymmetricKey {
        guard x.count == 32, y.count == 32 else { throw CryptoError(.invalidKey, "P-256 coordinates must be 32 bytes") }
        let pointer = try fromData(type: "EC", selection: selectPublicKey) { parameters in
            try parameters.push(utf8: "prime256v1", name: "group")
            try parameters.push(octets: [0x04] + x + y, name: "pub")
        }
        let key = try AsymmetricKey(takingOwnershipOf: pointer, hasPrivateKey: false)
        try key.check(publicOnly: true)
        return key
    }

    /// An EC P-256 private key from its scalar `d` and public point.
    public static func p256PrivateKey(d: [UInt8], x: [UInt8], y: [UInt8]) throws -> AsymmetricKey {
        guard d.count == 32, x.count == 32, y.count == 32 else {
            throw CryptoError(.invalidKey, "P-256 private key members must be 32 bytes")
        }
        let pointer = try fromData(type: "EC", selection: selectKeyPair) { parameters in
            try parameters.push(utf8: "prime256v1", name: "group")
            try parameters.push(octets: [0x04] + x + y, name: "pub")
            try parameters.push(bignum: d, name: "priv")
        }
        let key = try AsymmetricKey(takingOwnershipOf: pointer, hasPrivateKey: true)
        try key.check(publicOnly: false)
        return key
    }

    /// A private key from PEM: PKCS#8 `PRIVATE KEY` (Apple's `.p8`) or a traditional RSA/EC PEM.
    public static func privateKey(pem: String) throws -> AsymmetricKey {
        let bytes = Array(pem.utf8)
        let pointer: OpaquePointer? = bytes.withUnsafeBytes { raw in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            return PEM_read_bio_PrivateKey(bio, nil, nil, nil)
        }
        guard let pointer else { throw CryptoError.openSSL(.invalidKey, "not a PEM private key") }
        return try AsymmetricKey(takingOwnershipOf: pointer, hasPrivateKey: true)
    }

    /// A public key from DER SubjectPublicKeyInfo.
    public static func publicKey(der: [UInt8]) throws -> AsymmetricKey {
        let pointer: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_PUBKEY(nil, &cursor, buffer.count)
        }
        guard let pointer else { throw CryptoError.openSSL(.invalidKey, "not a DER public key") }
        return try AsymmetricKey(takingOwnershipOf: pointer, hasPrivateKey: false)
    }

    /// A fresh RSA key pair.
    public static func generateRSA(bits: Int = 2048) throws -> AsymmetricKey {
        try generate(type: "RSA") { context in EVP_PKEY_CTX_set_rsa_keygen_bits(context, Int32(bits)) }
    }

    /// A fresh EC P-256 key pair.
    public static func generateP256() throws -> AsymmetricKey {
        try generate(type: "EC") { context in EVP_PKEY_CTX_set_group_name(context, "prime256v1") }
    }

    // MARK: Export

    /// The private key as PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), the `.p8` format.
    public func privateKeyPEM() throws -> String {
        guard hasPrivateKey else { throw CryptoError(.invalidKey, "no private key to export") }
        return try writeBIO { bio in PEM_write_bio_PrivateKey(bio, pointer, nil, nil, 0, nil, nil) }
    }

    /// The public key as SubjectPublicKeyInfo PEM.
    public func publicKeyPEM() throws -> String {
        try writeBIO { bio in PEM_write_bio_PUBKEY(bio, pointer) }
    }

    /// RSA modulus and public exponent, big-endian without leading zeros.
    public func rsaComponents() throws -> (modulus: [UInt8], exponent: [UInt8]) {
        guard case .rsa = kind else { throw CryptoError(.invalidKey, "not an RSA key") }
        return (try bignumParameter("n"), try bignumParameter("e"))
    }

    /// The P-256 public point's coordinates, 32 bytes each.
    public func p256Coordinates() throws -> (x: [UInt8], y: [UInt8]) {
        guard kind == .ecP256 else { throw CryptoError(.invalidKey, "not an EC key") }
        return (try bignumParameter("qx", padTo: 32), try bignumParameter("qy", padTo: 32))
    }

    /// The P-256 private scalar, 32 bytes.
    public func p256PrivateScalar() throws -> [UInt8] {
        guard kind == .ecP256, hasPrivateKey else { throw CryptoError(.invalidKey, "not an EC private key") }
        return try bignumParameter("priv", padTo: 32)
    }

    // MARK: Signatures (SHA-256)

    /// Signs `message` with SHA-256: RSASSA-PKCS1-v1_5 for RSA, ECDSA (DER-encoded) for EC.
    public func signSHA256(_ message: some Collection<UInt8>) throws -> [UInt8] {
        guard hasPrivateKey else { throw CryptoError(.invalidKey, "signing needs a private key") }
        guard let context = EVP_MD_CTX_new() else { throw CryptoError.openSSL(.internalError, "EVP_MD_CTX_new") }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestSignInit(context, nil, EVP_sha256(), nil, pointer) == 1 else {
            throw CryptoError.openSSL(.internalError, "EVP_DigestSignInit")
        }
        return try withContiguousBytes(message) { input -> [UInt8] in
            let data = input.baseAddress?.assumingMemoryBound(to: UInt8.self)
            var length = 0
            guard EVP_DigestSign(context, nil, &length, data, input.count) == 1 else {
                throw CryptoError.openSSL(.internalError, "EVP_DigestSign (size)")
            }
            var signature = [UInt8](repeating: 0, count: length)
            guard EVP_DigestSign(context, &signature, &length, data, input.count) == 1 else {
                throw CryptoError.openSSL(.internalError, "EVP_DigestSign")
            }
            return Array(signature.prefix(length))
        }
    }

    /// Verifies a SHA-256 signature: PKCS#1 v1.5 for RSA, DER ECDSA for EC. Never throws:
    /// every failure, malformed input included, is `false`.
    ///
    /// Hashing and checking run on contexts initialised once per key and thread of use
    /// (`VerifyContext`): this is every login's signature check, and building a fresh
    /// `EVP_DigestVerify` context each time cost twice the RSA operation itself.
    public func verifySHA256(signature: some Collection<UInt8>, message: some Collection<UInt8>) -> Bool {
        withContiguousBytes(signature) { signature in
            withContiguousBytes(message) { verifySHA256(signature: signature, message: $0) }
        }
    }

    /// `verifySHA256(signature:message:)` on memory the caller holds (a JWS verifier passes
    /// the token's own bytes). Not generic, for the same reason as
    /// `SHA256.hash(_: UnsafeBufferPointer<UInt8>)`.
    public func verifySHA256(signature: UnsafeRawBufferPointer, message: UnsafeRawBufferPointer) -> Bool {
        guard let context = verifyContexts.withLock({ $0.popLast() }) ?? VerifyContext(key: self) else {
            ERR_clear_error()
            return false
        }
        let verified = context.verifySHA256(signature: signature, message: message)
        if !verified { ERR_clear_error() }
        verifyContexts.withLock { contexts in
            if contexts.count < 64 { contexts.append(context) }
        }
        return verified
    }

    // MARK: Helpers

    private func check(publicOnly: Bool) throws {
        guard let context = EVP_PKEY_CTX_new_from_pkey(nil, pointer, nil) else {
            throw CryptoError.openSSL(.internalError, "EVP_PKEY_CTX_new_from_pkey")
        }
        defer { EVP_PKEY_CTX_free(context) }
        let ok = publicOnly ? EVP_PKEY_public_check(context) : EVP_PKEY_check(context)
        guard ok == 1 else { throw CryptoError.openSSL(.invalidKey, "key failed validation (point not on curve?)") }
    }

    private func bignumParameter(_ name: String, padTo width: Int? = nil) throws -> [UInt8] {
        var bignum: OpaquePointer? = nil
        guard EVP_PKEY_get_bn_param(pointer, name, &bignum) == 1, let bignum else {
            throw CryptoError.openSSL(.invalidKey, "key parameter \(name)")
        }
        defer { BN_clear_free(bignum) }
        let length = (Int(BN_num_bits(bignum)) + 7) / 8
        let size = max(width ?? length, length)
        var bytes = [UInt8](repeating: 0, count: size)
        guard BN_bn2binpad(bignum, &bytes, Int32(size)) == Int32(size) else {
            throw CryptoError.openSSL(.internalError, "BN_bn2binpad")
        }
        return bytes
    }

    /// EVP_PKEY_fromdata with parameters made by `build`.
    private static func fromData(
        type: String, selection: Int32, build: (ParameterBuilder) throws -> Void
    ) throws -> OpaquePointer {
        let builder = try ParameterBuilder()
        try build(builder)
        let parameters = try builder.parameters()
        defer { OSSL_PARAM_free(parameters) }
        guard let context = EVP_PKEY_CTX_new_from_name(nil, type, nil) else {
            throw CryptoError.openSSL(.internalError, "EVP_PKEY_CTX_new_from_name")
        }
        defer { EVP_PKEY_CTX_free(context) }
        var key: OpaquePointer? = nil
        guard EVP_PKEY_fromdata_init(context) == 1,
            EVP_PKEY_fromdata(context, &key, selection, parameters) == 1, let key
        else { throw CryptoError.openSSL(.invalidKey, "\(type) key from parameters") }
        return key
    }

    private static func generate(type: String, configure: (OpaquePointer) -> Int32) throws -> AsymmetricKey {
        guard let context = EVP_PKEY_CTX_new_from_name(nil, type, nil) else {
            throw CryptoError.openSSL(.internalError, "EVP_PKEY_CTX_new_from_name")
        }
        defer { EVP_PKEY_CTX_free(context) }
        var key: OpaquePointer? = nil
        guard EVP_PKEY_keygen_init(context) == 1, configure(context) == 1,
            EVP_PKEY_generate(context, &key) == 1, let key
        else { throw CryptoError.openSSL(.internalError, "\(type) key generation") }
        return try AsymmetricKey(takingOwnershipOf: key, hasPrivateKey: true)
    }

    private func writeBIO(_ write: (OpaquePointer) -> Int32) throws -> String {
        guard let bio = BIO_new(BIO_s_mem()) else { throw CryptoError.openSSL(.internalError, "BIO_new") }
        defer { BIO_free(bio) }
        guard write(bio) == 1 else { throw CryptoError.openSSL(.internalError, "PEM write") }
        var output = [UInt8]()
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let read = BIO_read(bio, &chunk, Int32(chunk.count))
            if read <= 0 { break }
            output.append(contentsOf: chunk.prefix(Int(read)))
        }
        return String(decoding: output, as: UTF8.self)
    }
}

/// Owns an `OSSL_PARAM_BLD` and everything pushed into it. The builder keeps *pointers* to
/// names and buffers until `OSSL_PARAM_BLD_to_param`, so they are copied into C memory that
/// lives as long as this object, never passed as Swift temporaries.
final class ParameterBuilder {
    private let builder: OpaquePointer
    private var allocations: [UnsafeMutablePointer<CChar>] = []
    private var buffers: [UnsafeMutableRawPointer] = []
    private var bignums: [OpaquePointer] = []

    init() throws {
        guard let builder = OSSL_PARAM_BLD_new() else { throw CryptoError.openSSL(.internalError, "OSSL_PARAM_BLD_new") }
        self.builder = builder
    }

    deinit {
        OSSL_PARAM_BLD_free(builder)
        bignums.forEach { BN_clear_free($0) }
        allocations.forEach { free($0) }
        buffers.forEach { free($0) }
    }

    private func keep(_ text: String) -> UnsafeMutablePointer<CChar> {
        let copy = strdup(text)!
        allocations.append(copy)
        return copy
    }

    func push(bignum bytes: [UInt8], name: String) throws {
        guard let bignum = BN_bin2bn(bytes, Int32(bytes.count), nil) else {
            throw CryptoError.openSSL(.invalidKey, "BN_bin2bn")
        }
        bignums.append(bignum)
        guard OSSL_PARAM_BLD_push_BN(builder, keep(name), bignum) == 1 else {
            throw CryptoError.openSSL(.invalidKey, "key parameter \(name)")
        }
    }

    func push(utf8 value: String, name: String) throws {
        guard OSSL_PARAM_BLD_push_utf8_string(builder, keep(name), keep(value), 0) == 1 else {
            throw CryptoError.openSSL(.invalidKey, "key parameter \(name)")
        }
    }

    func push(octets bytes: [UInt8], name: String) throws {
        let buffer = malloc(max(1, bytes.count))!
        buffers.append(buffer)
        bytes.withUnsafeBytes { buffer.copyMemory(from: $0.baseAddress!, byteCount: bytes.count) }
        guard OSSL_PARAM_BLD_push_octet_string(builder, keep(name), buffer, bytes.count) == 1 else {
            throw CryptoError.openSSL(.invalidKey, "key parameter \(name)")
        }
    }

    /// The finished parameter array; free it with OSSL_PARAM_free.
    func parameters() throws -> UnsafeMutablePointer<OSSL_PARAM> {
        guard let parameters = OSSL_PARAM_BLD_to_param(builder) else {
            throw CryptoError.openSSL(.invalidKey, "OSSL_PARAM_BLD_to_param")
        }
        return parameters
    }
}

/// Owns one `EVP_PKEY_CTX` set up for SHA-256 signature verification with a key, and one
/// `EVP_MD_CTX` to hash the message with (reused: a fresh one per message costs about a
/// quarter of hashing a token). Not safe for concurrent use: `AsymmetricKey` hands each to
/// one caller at a time.
final class VerifyContext: @unchecked Sendable {
    let pointer: OpaquePointer
    let hash: OpaquePointer

    init?(key: AsymmetricKey) {
        guard let context = EVP_PKEY_CTX_new_from_pkey(nil, key.pointer, nil) else { return nil }
        guard let hash = EVP_MD_CTX_new() else {
            EVP_PKEY_CTX_free(context)
            return nil
        }
        var ok = EVP_PKEY_verify_init(context) == 1
        if ok, case .rsa = key.kind {
            ok = EVP_PKEY_CTX_set_rsa_padding(context, RSA_PKCS1_PADDING) == 1
        }
        ok = ok && EVP_PKEY_CTX_set_signature_md(context, FetchedAlgorithms.sha256) == 1
        guard ok else {
            EVP_PKEY_CTX_free(context)
            EVP_MD_CTX_free(hash)
            return nil
        }
        pointer = context
        self.hash = hash
    }

    deinit {
        EVP_PKEY_CTX_free(pointer)
        EVP_MD_CTX_free(hash)
    }

    /// Hashes `message` into a digest on the stack and checks `signature` over it.
    func verifySHA256(signature: UnsafeRawBufferPointer, message: UnsafeRawBufferPointer) -> Bool {
        var digest: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)
        return withUnsafeMutableBytes(of: &digest) { digest in
            let output = digest.baseAddress!.assumingMemoryBound(to: UInt8.self)
            var length: UInt32 = 0
            guard EVP_DigestInit_ex2(hash, FetchedAlgorithms.sha256, nil) == 1,
                EVP_DigestUpdate(hash, message.baseAddress, message.count) == 1,
                EVP_DigestFinal_ex(hash, output, &length) == 1, Int(length) == digest.count
            else { return false }
            return EVP_PKEY_verify(
                pointer, signature.baseAddress?.assumingMemoryBound(to: UInt8.self), signature.count, output, digest.count) == 1
        }
    }
}
