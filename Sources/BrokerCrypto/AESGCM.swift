import COpenSSL

/// AES-256-GCM authenticated encryption (NIST SP 800-38D) through OpenSSL.
///
/// `seal` draws a fresh random 96-bit nonce for every message; the output is
/// `nonce ‖ ciphertext ‖ tag` so one value can be stored in a `bytea` column.
public enum AES256GCM {
    public static let keyByteCount = 32
    public static let nonceByteCount = 12
    public static let tagByteCount = 16

    /// Encrypts `plaintext`, binding `associatedData` (authenticated, not encrypted).
    public static func seal(_ plaintext: [UInt8], key: [UInt8], associatedData: [UInt8] = []) throws -> [UInt8] {
        guard key.count == keyByteCount else { throw CryptoError(.invalidInput, "AES-256-GCM needs a 32-byte key") }
        let nonce = SecureRandom.bytes(nonceByteCount)
        let context = try CipherContext()
        var ok = EVP_EncryptInit_ex(context.pointer, EVP_aes_256_gcm(), nil, nil, nil)
        ok &= EVP_CIPHER_CTX_ctrl(context.pointer, EVP_CTRL_GCM_SET_IVLEN, Int32(nonceByteCount), nil)
        ok &= EVP_EncryptInit_ex(context.pointer, nil, nil, key, nonce)
        var length: Int32 = 0
        if !associatedData.isEmpty {
            ok &= EVP_EncryptUpdate(context.pointer, nil, &length, associatedData, Int32(associatedData.count))
        }
        var ciphertext = [UInt8](repeating: 0, count: plaintext.count + 16)
        var written: Int32 = 0
        if !plaintext.isEmpty {
            ok &= EVP_EncryptUpdate(context.pointer, &ciphertext, &written, plaintext, Int32(plaintext.count))
        }
        var final: Int32 = 0
        ok &= ciphertext.withUnsafeMutableBufferPointer {
            EVP_EncryptFinal_ex(context.pointer, $0.baseAddress! + Int(written), &final)
        }
        var tag = [UInt8](repeating: 0, count: tagByteCount)
        ok &= EVP_CIPHER_CTX_ctrl(context.pointer, EVP_CTRL_GCM_GET_TAG, Int32(tagByteCount), &tag)
        guard ok == 1 else { throw CryptoError.openSSL(.internalError, "AES-256-GCM encryption") }
        return nonce + ciphertext.prefix(Int(written + final)) + tag
    }

    /// Decrypts the output of `seal`; throws `authenticationFailed` if anything was altered.
    public static func open(_ sealed: [UInt8], key: [UInt8], associatedData: [UInt8] = []) throws -> [UInt8] {
        guard key.count == keyByteCount else { throw CryptoError(.invalidInput, "AES-256-GCM needs a 32-byte key") }
        guard sealed.count >= nonceByteCount + tagByteCount else {
            throw CryptoError(.invalidInput, "sealed box shorter than nonce and tag")
        }
        let nonce = Array(sealed.prefix(nonceByteCount))
        var tag = Array(sealed.suffix(tagByteCount))
        let ciphertext = Array(sealed[nonceByteCount..<(sealed.count - tagByteCount)])
        let context = try CipherContext()
        var ok = EVP_DecryptInit_ex(context.pointer, EVP_aes_256_gcm(), nil, nil, nil)
        ok &= EVP_CIPHER_CTX_ctrl(context.pointer, EVP_CTRL_GCM_SET_IVLEN, Int32(nonceByteCount), nil)
        ok &= EVP_DecryptInit_ex(context.pointer, nil, nil, key, nonce)
        var length: Int32 = 0
        if !associatedData.isEmpty {
            ok &= EVP_DecryptUpdate(context.pointer, nil, &length, associatedData, Int32(associatedData.count))
        }
        var plaintext = [UInt8](repeating: 0, count: ciphertext.count + 16)
        var written: Int32 = 0
        if !ciphertext.isEmpty {
            ok &= EVP_DecryptUpdate(context.pointer, &plaintext, &written, ciphertext, Int32(ciphertext.count))
        }
        ok &= EVP_CIPHER_CTX_ctrl(context.pointer, EVP_CTRL_GCM_SET_TAG, Int32(tagByteCount), &tag)
        guard ok == 1 else { throw CryptoError.openSSL(.internalError, "AES-256-GCM decryption setup") }
        var final: Int32 = 0
        let verified = plaintext.withUnsafeMutableBufferPointer {
            EVP_DecryptFinal_ex(context.pointer, $0.baseAddress! + Int(written), &final)
        }
        guard verified == 1 else {
            ERR_clear_error()
            throw CryptoError(.authenticationFailed, "AES-256-GCM tag mismatch")
        }
        return Array(plaintext.prefix(Int(written + final)))
    }
}

/// Owns one `EVP_CIPHER_CTX` and frees it.
final class CipherContext {
    let pointer: OpaquePointer

    init() throws {
        guard let pointer = EVP_CIPHER_CTX_new() else {
            throw CryptoError.openSSL(.internalError, "EVP_CIPHER_CTX_new")
        }
        self.pointer = pointer
    }

    deinit { EVP_CIPHER_CTX_free(pointer) }
}
