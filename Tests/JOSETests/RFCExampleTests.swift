import BrokerCrypto
import Foundation
import JOSE
import StrictJSON
import TestSupport
import Testing

/// The worked examples of RFC 7515 Appendix A and RFC 7520 §4 (JOSE Cookbook).
@Suite("RFC examples", .enabled(if: TestData.shouldRun, Comment(rawValue: TestData.skipMessage)))
struct RFCExampleTests {
    let verifier = JWSVerifier()

    private func rfc7515(_ section: String) throws -> [String: Any] {
        let file = try #require(try TestData.json("jose/rfc7515_appendix_a.json") as? [String: Any])
        let tests = file["tests"] as! [[String: Any]]
        return try #require(tests.first { $0["rfc7515Section"] as? String == section })
    }

    private func jwk(_ object: Any) throws -> JWK {
        try JWK(json: Array(try JSONSerialization.data(withJSONObject: object)))
    }

    /// The token with one bit of its signature flipped.
    private func flipped(_ token: String) -> String {
        var parts = token.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        var signature = Base64URL.decode(parts[2])!
        signature[signature.count / 2] ^= 0x01
        parts[2] = Base64URL.encode(signature)
        return parts.joined(separator: ".")
    }

    @Test("RFC 7515 A.2 (RS256) verifies, its signature is reproduced exactly, and one flipped bit fails")
    func rfc7515RS256() throws {
        let example = try rfc7515("A.2")
        let publicKey = try jwk(example["publicJwk"]!)
        let compact = example["compact"] as! String
        let verified = try verifier.verify(compact, key: publicKey)
        #expect(String(decoding: verified.payload, as: UTF8.self) == example["payload"] as! String)
        #expect(throws: JOSEError(.signatureInvalid, "the signature does not verify")) {
            try verifier.verify(flipped(compact), key: publicKey)
        }
        // RSASSA-PKCS1-v1_5 is deterministic: our signer must produce the RFC's bytes.
        let privateKey = try jwk(example["jwk"]!)
        let signature = try privateKey.key.signSHA256(Array((example["signingInput"] as! String).utf8))
        #expect(Base64URL.encode(signature) == example["signatureB64u"] as! String)
    }

    @Test("RFC 7515 A.3 (ES256) verifies and one flipped bit fails")
    func rfc7515ES256() throws {
        let example = try rfc7515("A.3")
        let publicKey = try jwk(example["publicJwk"]!)
        let compact = example["compact"] as! String
        #expect(try verifier.verify(compact, key: publicKey).header.algorithm == "ES256")
        #expect(throws: JOSEError.self) { try verifier.verify(flipped(compact), key: publicKey) }
        // The private JWK signs tokens the public one verifies (ECDSA is randomized: no fixed bytes).
        let signer = try JWSSigner(key: try jwk(example["jwk"]!).key, keyID: nil)
        let token = try signer.sign(payload: Array("hello".utf8))
        #expect(try verifier.verify(token, key: publicKey).payload == Array("hello".utf8))
    }

    @Test("RFC 7515 A.1 (HS256), A.4 (ES512) and A.5 (none) are refused as unsupported algorithms")
    func rfc7515Unsupported() throws {
        let anyKey = try jwk(try rfc7515("A.3")["publicJwk"]!)
        for section in ["A.1", "A.4", "A.5"] {
            let compact = try rfc7515(section)["compact"] as! String
            let error = #expect(throws: JOSEError.self, "\(section)") { try verifier.verify(compact, key: anyKey) }
            #expect(error?.code == .unsupportedAlgorithm, "\(section)")
        }
    }

    @Test("RFC 7520 §4.1 (RS256) verifies by kid from a JWK Set, reproduces exactly, and one flipped bit fails")
    func rfc7520RS256() throws {
        let example = try #require(try TestData.json("jose/rfc7520-cookbook/jws/4_1.rsa_v15_signature.json") as? [String: Any])
        let input = example["input"] as! [String: Any]
        let privateKey = try jwk(input["key"]!)
        let keys = JWKSet(keys: [
            JWK(
                key: try AsymmetricKey.rsaPublicKey(
                    modulus: try privateKey.key.rsaComponents().modulus, exponent: try privateKey.key.rsaComponents().exponent),
                keyID: privateKey.keyID)
        ])
        let compact = (example["output"] as! [String: Any])["compact"] as! String
        let verified = try verifier.verify(compact, keys: keys)
        #expect(verified.keyID == "bilbo.baggins@hobbiton.example")
        #expect(String(decoding: verified.payload, as: UTF8.self) == input["payload"] as! String)
        #expect(throws: JOSEError.self) { try verifier.verify(flipped(compact), keys: keys) }
        let signing = example["signing"] as! [String: Any]
        let signature = try privateKey.key.signSHA256(Array((signing["sig-input"] as! String).utf8))
        #expect(Base64URL.encode(signature) == signing["sig"] as! String)
    }

    @Test("RFC 7520 §4.2 PS384, §4.3 ES512 and §4.4 HS256 are refused as unsupported, not crashed on")
    func rfc7520Unsupported() throws {
        let keys = JWKSet(keys: [JWK(key: try AsymmetricKey.generateRSA(), keyID: "bilbo.baggins@hobbiton.example")])
        for file in ["4_2.rsa-pss_signature", "4_3.ecdsa_signature", "4_4.hmac-sha2_integrity_protection"] {
            let example = try #require(try TestData.json("jose/rfc7520-cookbook/jws/\(file).json") as? [String: Any])
            let key = (example["input"] as! [String: Any])["key"]!
            if file.hasPrefix("4_2") {
                // An RSA key is loadable, but verifying with it is RS256 only.
                #expect(throws: JOSEError.self) {
                    try verifier.verify((example["output"] as! [String: Any])["compact"] as! String, key: try jwk(key))
                }
            } else {
                // P-521 and symmetric keys are not keys we can even load.
                #expect(throws: JOSEError.self) { try jwk(key) }
            }
            let compact = (example["output"] as! [String: Any])["compact"] as! String
            let error = #expect(throws: JOSEError.self, "\(file)") { try verifier.verify(compact, keys: keys) }
            #expect(error?.code == .unsupportedAlgorithm, "\(file)")
        }
    }
}
