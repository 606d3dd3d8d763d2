import BrokerCrypto
import Testing

@Suite("BrokerCrypto")
struct CryptoTests {
    @Test("SHA-256 and HMAC-SHA-256 match FIPS 180-2 and RFC 4231 vectors")
    func digests() {
        #expect(Hex.encode(SHA256.hash("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(
            Hex.encode(HMACSHA256.authenticate(Array("what do ya want for nothing?".utf8), key: Array("Jefe".utf8)))
                == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        #expect(SHA256.hexHash("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    }

    @Test("AES-256-GCM opens what it sealed, and refuses a flipped bit, the wrong key or the wrong associated data")
    func aesGCM() throws {
        let key = SecureRandom.bytes(32)
        let sealed = try AES256GCM.seal(Array("refresh-token".utf8), key: key, associatedData: Array("identity-1".utf8))
        #expect(try AES256GCM.open(sealed, key: key, associatedData: Array("identity-1".utf8)) == Array("refresh-token".utf8))
        #expect(sealed.count == 12 + 13 + 16)
        var tampered = sealed
        tampered[14] ^= 1
        #expect(throws: CryptoError.self) { try AES256GCM.open(tampered, key: key, associatedData: Array("identity-1".utf8)) }
        #expect(throws: CryptoError.self) {
            try AES256GCM.open(sealed, key: SecureRandom.bytes(32), associatedData: Array("identity-1".utf8))
        }
        #expect(throws: CryptoError.self) { try AES256GCM.open(sealed, key: key, associatedData: Array("identity-2".utf8)) }
        // Fresh nonces: the same plaintext never seals to the same bytes.
        #expect(try AES256GCM.seal([1, 2, 3], key: key) != AES256GCM.seal([1, 2, 3], key: key))
    }

    @Test("a .p8 (PKCS#8 PEM) P-256 key round-trips and signs what its public half verifies")
    func p8() throws {
        let key = try AsymmetricKey.generateP256()
        let pem = try key.privateKeyPEM()
        #expect(pem.hasPrefix("-----BEGIN PRIVATE KEY-----"))
        let loaded = try AsymmetricKey.privateKey(pem: pem)
        #expect(loaded.kind == .ecP256)
        #expect(try loaded.p256PrivateScalar() == key.p256PrivateScalar())
        let (x, y) = try key.p256Coordinates()
        let publicKey = try AsymmetricKey.p256PublicKey(x: x, y: y)
        let signature = try loaded.signSHA256(Array("message".utf8))
        #expect(publicKey.verifySHA256(signature: signature, message: Array("message".utf8)))
        #expect(!publicKey.verifySHA256(signature: signature, message: Array("massage".utf8)))
        #expect(throws: CryptoError.self) {
            try AsymmetricKey.privateKey(pem: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----")
        }
    }

    @Test("a key's reused verification contexts answer every check on its own merits, from many threads")
    func reusedVerifyContexts() async throws {
        let rsa = try AsymmetricKey.generateRSA()
        let (modulus, exponent) = try rsa.rsaComponents()
        let publicKey = try AsymmetricKey.rsaPublicKey(modulus: modulus, exponent: exponent)
        let messages = (0..<8).map { Array("message \($0)".utf8) }
        let signatures = try messages.map { try rsa.signSHA256($0) }
        // Each context hashes with its own reused digest state: a failed check, a truncated
        // signature or an empty message must leave nothing behind for the next caller.
        let results = await withTaskGroup(of: Bool.self) { group in
            for worker in 0..<4 {
                group.addTask {
                    var correct = true
                    for round in 0..<200 {
                        let index = (worker + round) % messages.count
                        let other = (index + 1) % messages.count
                        correct = correct && publicKey.verifySHA256(signature: signatures[index], message: messages[index])
                        correct = correct && !publicKey.verifySHA256(signature: signatures[other], message: messages[index])
                        correct =
                            correct && !publicKey.verifySHA256(signature: signatures[index].dropLast(), message: messages[index])
                        correct = correct && !publicKey.verifySHA256(signature: signatures[index], message: [UInt8]())
                    }
                    return correct
                }
            }
            return await group.reduce(into: [Bool]()) { $0.append($1) }
        }
        #expect(results == [true, true, true, true])
    }

    @Test("raw r‖s and DER convert both ways; other lengths are refused")
    func ecdsaEncoding() throws {
        let raw = [UInt8](repeating: 0, count: 31) + [1] + [UInt8](repeating: 0x7F, count: 32)
        let der = try ECDSASignature.der(fromRaw: raw)
        #expect(try ECDSASignature.raw(fromDER: der) == raw)
        #expect(throws: CryptoError.self) { try ECDSASignature.der(fromRaw: Array(raw.dropLast())) }
        #expect(throws: CryptoError.self) { try ECDSASignature.der(fromRaw: raw + [0, 0]) }
    }

    @Test("points off the curve are refused")
    func offCurve() {
        #expect(throws: CryptoError.self) {
            try AsymmetricKey.p256PublicKey(x: [UInt8](repeating: 1, count: 32), y: [UInt8](repeating: 2, count: 32))
        }
    }

    @Test("constant-time comparison compares")
    func constantTime() {
        #expect(ConstantTime.equals([1, 2, 3], [1, 2, 3]))
        #expect(!ConstantTime.equals([1, 2, 3], [1, 2, 4]))
        #expect(!ConstantTime.equals([1, 2, 3], [1, 2]))
    }
}
