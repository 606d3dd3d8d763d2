import BrokerCrypto
import StrictJSON

/// A JSON Web Key (RFC 7517) for RSA or EC P-256, public or private.
///
/// Parsing refuses what must not be trusted: RSA moduli under 2048 bits, public exponents
/// that are even or below 3, EC points not on P-256, other curves and key types.
public struct JWK: Sendable {
    /// The members, in one immutable object: a JWK is copied out of the key cache for every
    /// token verified, and copying one reference costs less than copying each member.
    private final class Storage: Sendable {
        let keyType: String
        let keyID: String?
        let use: String?
        let keyOperations: [String]?
        let declaredAlgorithm: String?
        let key: AsymmetricKey
        let algorithm: JWSAlgorithm?
        let canVerify: Bool

        init(
            keyType: String, keyID: String?, use: String?, keyOperations: [String]?, declaredAlgorithm: String?,
            key: AsymmetricKey
        ) {
            self.keyType = keyType
            self.keyID = keyID
            self.use = use
            self.keyOperations = keyOperations
            self.declaredAlgorithm = declaredAlgorithm
            self.key = key
            let implied = JWSAlgorithm(for: key)
            algorithm = declaredAlgorithm == nil || declaredAlgorithm == implied?.rawValue ? implied : nil
            canVerify = (use == nil || use == "sig") && (keyOperations?.contains("verify") ?? true) && algorithm != nil
        }
    }

    private let storage: Storage

    public var keyType: String { storage.keyType }
    public var keyID: String? { storage.keyID }
    /// `use`, if present (`sig` or `enc`).
    public var use: String? { storage.use }
    /// `key_ops`, if present.
    public var keyOperations: [String]? { storage.keyOperations }
    /// `alg` as written in the JWK, if present.
    public var declaredAlgorithm: String? { storage.declaredAlgorithm }
    public var key: AsymmetricKey { storage.key }
    /// The algorithm this key verifies and signs with: its declared `alg` when that is one we
    /// support and fits the key, otherwise the one implied by the key type; nil when the
    /// declared `alg` is anything else (the key is then unusable rather than reinterpreted).
    /// Worked out once, with `canVerify`: both are read for every token verified.
    public var algorithm: JWSAlgorithm? { storage.algorithm }
    /// Whether the key may verify signatures: `use` is absent or `sig`, `key_ops` absent or
    /// containing `verify`, and its algorithm is supported.
    public var canVerify: Bool { storage.canVerify }

    /// Parses one JWK from JSON text.
    public init(json: [UInt8]) throws {
        try self.init(object: JOSEError.parsingObject(json))
    }

    /// Parses one JWK from a decoded JSON object.
    public init(object: [String: JSONValue]) throws {
        func member(_ name: String) throws -> String? {
            guard let value = object[name] else { return nil }
            guard let text = value.stringValue else { throw JOSEError(.invalidKey, "JWK member \(name) is not a string") }
            return text
        }
        func bytes(_ name: String) throws -> [UInt8] {
            guard let text = try member(name) else { throw JOSEError(.invalidKey, "JWK lacks \(name)") }
            guard let decoded = Base64URL.decode(text) else { throw JOSEError(.invalidKey, "JWK \(name) is not base64url") }
            return decoded
        }
        guard let keyType = try member("kty") else { throw JOSEError(.invalidKey, "JWK lacks kty") }
        let keyID = try member("kid")
        let use = try member("use")
        let declaredAlgorithm = try member("alg")
        let keyOperations: [String]?
        if let operations = object["key_ops"] {
            guard let list = operations.arrayValue?.compactMap(\.stringValue), list.count == operations.arrayValue?.count else {
                throw JOSEError(.invalidKey, "JWK key_ops is not a list of strings")
            }
            keyOperations = list
        } else {
            keyOperations = nil
        }
        let key: AsymmetricKey
        do {
            switch keyType {
            case "RSA":
                let modulus = Array(try bytes("n").drop(while: { $0 == 0 }))
                let exponent = Array(try bytes("e").drop(while: { $0 == 0 }))
                guard modulus.count * 8 >= 2048, modulus.count <= 1024 else {
                    throw JOSEError(.invalidKey, "RSA modulus must be 2048 to 8192 bits")
                }
                guard !exponent.isEmpty, exponent.count <= 8, exponent.last! & 1 == 1,
                    exponent.count > 1 || exponent[0] >= 3
                else { throw JOSEError(.invalidKey, "RSA public exponent must be odd and at least 3") }
                if object["d"] != nil {
                    key = try AsymmetricKey.rsaPrivateKey(
                        modulus: modulus, publicExponent: exponent, privateExponent: try bytes("d"),
                        prime1: try bytes("p"), prime2: try bytes("q"), exponent1: try bytes("dp"),
                        exponent2: try bytes("dq"), coefficient: try bytes("qi"))
                } else {
                    key = try AsymmetricKey.rsaPublicKey(modulus: modulus, exponent: exponent)
                }
            case "EC":
                guard try member("crv") == "P-256" else { throw JOSEError(.invalidKey, "only the P-256 curve is supported") }
                let x = try bytes("x")
                let y = try bytes("y")
                if object["d"] != nil {
                    key = try AsymmetricKey.p256PrivateKey(d: try bytes("d"), x: x, y: y)
                } else {
                    key = try AsymmetricKey.p256PublicKey(x: x, y: y)
                }
            default:
                throw JOSEError(.invalidKey, "unsupported key type \(keyType)")
            }
        } catch let error as CryptoError {
            throw JOSEError(.invalidKey, "JWK key material rejected: \(error.reason)")
        }
        storage = Storage(
            keyType: keyType, keyID: keyID, use: use, keyOperations: keyOperations, declaredAlgorithm: declaredAlgorithm, key: key
        )
    }

    /// Wraps an existing key.
    public init(key: AsymmetricKey, keyID: String?, use: String? = "sig") {
        let keyType =
            switch key.kind {
            case .rsa: "RSA"
            case .ecP256: "EC"
            }
        storage = Storage(
            keyType: keyType, keyID: keyID, use: use, keyOperations: nil, declaredAlgorithm: JWSAlgorithm(for: key)?.rawValue,
            key: key)
    }

    /// The public JWK as a JSON object (what `/auth/keys` publishes).
    public func publicJSON() throws -> [String: JSONValue] {
        var object: [String: JSONValue] = ["kty": .string(keyType)]
        if let keyID { object["kid"] = .string(keyID) }
        if let use { object["use"] = .string(use) }
        if let declaredAlgorithm { object["alg"] = .string(declaredAlgorithm) }
        switch key.kind {
        case .rsa:
            let (modulus, exponent) = try key.rsaComponents()
            object["n"] = .string(Base64URL.encode(modulus))
            object["e"] = .string(Base64URL.encode(exponent))
        case .ecP256:
            let (x, y) = try key.p256Coordinates()
            object["crv"] = "P-256"
            object["x"] = .string(Base64URL.encode(x))
            object["y"] = .string(Base64URL.encode(y))
        }
        return object
    }
}

/// A JWK Set (RFC 7517 §5), such as Apple's `/auth/keys`.
public struct JWKSet: Sendable {
    /// The keys that parsed; entries of unsupported types are skipped, not fatal, because a
    /// provider may publish keys this service never needs.
    public let keys: [JWK]

    public init(keys: [JWK]) { self.keys = keys }

    /// Parses `{"keys":[…]}`.
    /// - Throws: `malformed` when the text is not such an object or no key is usable.
    public init(json: [UInt8]) throws {
        let object = try JOSEError.parsingObject(json)
        guard let entries = object["keys"]?.arrayValue else { throw JOSEError(.malformed, "JWK Set lacks a keys array") }
        keys = entries.compactMap { entry in entry.objectValue.flatMap { try? JWK(object: $0) } }
    }

    /// The verification key named `keyID`. Ambiguity is refused: when several usable keys
    /// share the id, none is returned.
    public func verificationKey(keyID: String) -> JWK? {
        let matches = keys.filter { $0.keyID == keyID && $0.canVerify }
        return matches.count == 1 ? matches[0] : nil
    }

    /// The set as JSON text, public members only.
    public func publicJSON() throws -> [UInt8] {
        JSONValue.object(["keys": .array(try keys.map { .object(try $0.publicJSON()) })]).serialized()
    }
}
