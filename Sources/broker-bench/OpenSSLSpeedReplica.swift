import BrokerCrypto
import COpenSSL

/// The operation `openssl speed rsa2048` times as "verify": `EVP_PKEY_verify` of a 36-byte
/// message under PKCS#1 v1.5 padding, no digest, on one reused context. broker-bench runs
/// it in alternating slices with a full identity-token validation, so their ratio is free
/// of this VM's drift, which moves separate `openssl speed` runs by ±10 %. Benchmarks only.
final class OpenSSLSpeedReplica: @unchecked Sendable {
    /// This benchmark's own copy of the key (read from its PEM), so the production crypto
    /// module need not hand out its `EVP_PKEY`.
    private let key: OpaquePointer
    private let context: OpaquePointer
    private let message: [UInt8] = Array(repeating: 0x5A, count: 36)
    private let signature: [UInt8]

    /// `key` must be an RSA private key: the signature is made once, here.
    init(key: AsymmetricKey) throws {
        guard case .rsa = key.kind, key.hasPrivateKey else { throw SpeedReplicaError("needs an RSA private key") }
        let pem = Array(try key.privateKeyPEM().utf8)
        // The BIO reads the bytes in place: both calls inside the buffer's lifetime.
        let read: OpaquePointer? = pem.withUnsafeBytes { bytes in
            guard let bio = BIO_new_mem_buf(bytes.baseAddress, Int32(bytes.count)) else { return nil }
            defer { BIO_free(bio) }
            return PEM_read_bio_PrivateKey(bio, nil, nil, nil)
        }
        guard let pkey = read else { throw SpeedReplicaError("PEM_read_bio_PrivateKey") }
        self.key = pkey
        guard let signer = EVP_PKEY_CTX_new_from_pkey(nil, pkey, nil) else {
            EVP_PKEY_free(pkey)
            throw SpeedReplicaError("EVP_PKEY_CTX_new_from_pkey")
        }
        defer { EVP_PKEY_CTX_free(signer) }
        var length = 512
        var signature = [UInt8](repeating: 0, count: length)
        guard EVP_PKEY_sign_init(signer) == 1, EVP_PKEY_CTX_set_rsa_padding(signer, RSA_PKCS1_PADDING) == 1,
            EVP_PKEY_sign(signer, &signature, &length, message, message.count) == 1
        else {
            EVP_PKEY_free(pkey)
            throw SpeedReplicaError("EVP_PKEY_sign")
        }
        self.signature = Array(signature.prefix(length))
        guard let context = EVP_PKEY_CTX_new_from_pkey(nil, pkey, nil) else {
            EVP_PKEY_free(pkey)
            throw SpeedReplicaError("EVP_PKEY_CTX_new_from_pkey")
        }
        guard EVP_PKEY_verify_init(context) == 1, EVP_PKEY_CTX_set_rsa_padding(context, RSA_PKCS1_PADDING) == 1 else {
            EVP_PKEY_CTX_free(context)
            EVP_PKEY_free(pkey)
            throw SpeedReplicaError("EVP_PKEY_verify_init")
        }
        self.context = context
    }

    deinit {
        EVP_PKEY_CTX_free(context)
        EVP_PKEY_free(key)
    }

    /// One verification; true when it verifies (it always should). Not for concurrent use.
    func verify() -> Bool {
        EVP_PKEY_verify(context, signature, signature.count, message, message.count) == 1
    }
}

struct SpeedReplicaError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = "openssl speed replica: " + description }
}
