import BrokerCrypto
import Foundation

/// The AES-256-GCM keys that encrypt secrets at rest (refresh tokens, webhook signing
/// secrets), each with an id stored beside the ciphertext so keys can rotate: the first
/// key encrypts, every key decrypts.
///
/// `TOKEN_ENCRYPTION_KEY` is either one base64 key (its id is derived from it) or
/// `id:base64,id:base64,…` with the current key first.
public struct TokenKeyRing: Sendable {
    public let currentKeyID: String
    private let keys: [String: [UInt8]]
    /// Key ids, the current one first.
    public let keyIDs: [String]

    public struct Invalid: Error, CustomStringConvertible {
        public let description: String
    }

    public init(parsing text: String) throws {
        var keys: [String: [UInt8]] = [:]
        var order: [String] = []
        for entry in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !entry.isEmpty {
            let parts = entry.split(separator: ":", maxSplits: 1).map(String.init)
            let (id, encoded): (String?, String) = parts.count == 2 ? (parts[0], parts[1]) : (nil, parts[0])
            guard let data = Data(base64Encoded: encoded), data.count == AES256GCM.keyByteCount else {
                throw Invalid(description: "each key must be 32 bytes in base64 (openssl rand -base64 32)")
            }
            let bytes = Array(data)
            let keyID = id ?? "k" + String(Hex.encode(SHA256.hash(bytes)).prefix(8))
            guard !keyID.isEmpty, keyID.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" }) else {
                throw Invalid(description: "key ids may use letters, digits, - and _ only")
            }
            guard keys[keyID] == nil else { throw Invalid(description: "key id '\(keyID)' appears twice") }
            keys[keyID] = bytes
            order.append(keyID)
        }
        guard let current = order.first else { throw Invalid(description: "no key given") }
        self.currentKeyID = current
        self.keys = keys
        self.keyIDs = order
    }

    /// A key of its own for one purpose (sealing web sign-in state, keying hashes), derived
    /// from the key `keyID` (default: the current one) so that no key serves two purposes:
    /// HKDF-Expand (RFC 5869 §2.3) for one 32-byte block, the stored key as the PRK (it is
    /// uniformly random, so HKDF-Extract adds nothing, §3.3), `appleid-broker/<purpose>` as info.
    public func derivedKey(_ purpose: String, keyID: String? = nil) -> [UInt8]? {
        guard let key = keys[keyID ?? currentKeyID] else { return nil }
        return HMACSHA256.authenticate(Array("appleid-broker/\(purpose)".utf8) + [1], key: key)
    }

    /// Encrypts with the current key.
    public func seal(_ plaintext: [UInt8], associatedData: [UInt8]) throws -> (keyID: String, sealed: [UInt8]) {
        (currentKeyID, try AES256GCM.seal(plaintext, key: keys[currentKeyID]!, associatedData: associatedData))
    }

    /// Decrypts with the key named by `keyID`.
    public func open(_ sealed: [UInt8], keyID: String, associatedData: [UInt8]) throws -> [UInt8] {
        guard let key = keys[keyID] else {
            throw CryptoError(.invalidKey, "no key '\(keyID)' in TOKEN_ENCRYPTION_KEY; was it rotated out too early?")
        }
        return try AES256GCM.open(sealed, key: key, associatedData: associatedData)
    }
}
