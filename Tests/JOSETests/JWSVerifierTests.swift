import BrokerCrypto
import Foundation
import JOSE
import StrictJSON
import Testing

/// Attacks and malformed input the verifier must refuse, with tokens built here.
@Suite("JWSVerifier")
struct JWSVerifierTests {
    static let rsa = try! AsymmetricKey.generateRSA()
    static let ec = try! AsymmetricKey.generateP256()
    let verifier = JWSVerifier()
    let keys = JWKSet(keys: [JWK(key: Self.rsa, keyID: "rsa-1"), JWK(key: Self.ec, keyID: "ec-1")])

    private func token(header: String, payload: String = #"{"sub":"x"}"#, key: AsymmetricKey = Self.rsa) throws -> String {
        let input = Base64URL.encode(header) + "." + Base64URL.encode(payload)
        var signature = try key.signSHA256(Array(input.utf8))
        if key.kind == .ecP256 { signature = try ECDSASignature.raw(fromDER: signature) }
        return input + "." + Base64URL.encode(signature)
    }

    private func code(_ token: String, _ keys: JWKSet? = nil) -> JOSEError.Code? {
        do {
            _ = try verifier.verify(token, keys: keys ?? self.keys)
            return nil
        } catch let error as JOSEError {
            return error.code
        } catch {
            return JOSEError.Code.malformed
        }
    }

    @Test("RS256 and ES256 tokens signed by trusted keys verify; the claims come back")
    func roundTrip() throws {
        let rs = try JWSSigner(key: Self.rsa, keyID: "rsa-1").sign(claims: ["sub": "a", "n": 1])
        #expect(try verifier.verify(rs, keys: keys).claims()["sub"] == "a")
        let es = try JWSSigner(key: Self.ec, keyID: "ec-1").sign(claims: ["sub": "b"])
        #expect(try verifier.verify(es, keys: keys).claims()["sub"] == "b")
    }

    @Test("the verifier's cache of decoded headers never changes a verdict")
    func headerCacheKeepsVerdicts() throws {
        // One verifier sees the same header bytes again and again, as with Apple's tokens.
        let header = #"{"kid":"rsa-1","alg":"RS256"}"#
        let good = try token(header: header)
        #expect(code(good) == nil)
        #expect(code(good) == nil)
        // Same header bytes, forged signature or payload: still refused.
        let parts = good.split(separator: ".").map(String.init)
        #expect(code(parts[0] + "." + Base64URL.encode(#"{"sub":"y"}"#) + "." + parts[2]) == .signatureInvalid)
        #expect(code(parts[0] + "." + parts[1] + "." + String(parts[2].reversed())) != nil)
        // A header differing in one byte is decoded afresh and judged on its own.
        #expect(code(try token(header: #"{"kid":"rsa-1","alg":"RS384"}"#)) == .unsupportedAlgorithm)
        #expect(code(try token(header: #"{"kid":"rsa-9","alg":"RS256"}"#)) == .keyNotFound)
        // More distinct headers than the cache holds, then the first again.
        for index in 0..<20 {
            #expect(code(try token(header: #"{"kid":"rsa-1","alg":"RS256","n":\#(index)}"#)) == nil)
        }
        #expect(code(good) == nil)
    }

    @Test("alg none, HMAC with the public key as secret, and RS/ES confusion are refused")
    func algorithmAttacks() throws {
        let none = Base64URL.encode(#"{"alg":"none","kid":"rsa-1"}"#) + "." + Base64URL.encode(#"{"sub":"x"}"#) + "."
        #expect(code(none) == .unsupportedAlgorithm)

        // HS256 "signed" with the RSA public key's PEM as the HMAC secret (the classic confusion).
        let input = Base64URL.encode(#"{"alg":"HS256","kid":"rsa-1"}"#) + "." + Base64URL.encode(#"{"sub":"x"}"#)
        let mac = HMACSHA256.authenticate(Array(input.utf8), key: Array(try Self.rsa.publicKeyPEM().utf8))
        #expect(code(input + "." + Base64URL.encode(mac)) == .unsupportedAlgorithm)

        // ES256 claimed, but the kid names the RSA key: the key decides, so it is a mismatch.
        #expect(code(try token(header: #"{"alg":"ES256","kid":"rsa-1"}"#, key: Self.ec)) == .algorithmMismatch)
        #expect(code(try token(header: #"{"alg":"RS256","kid":"ec-1"}"#)) == .algorithmMismatch)
        #expect(code(try token(header: #"{"alg":"PS256","kid":"rsa-1"}"#)) == .unsupportedAlgorithm)
    }

    @Test("a token signed by an untrusted key fails even when it embeds that key (jwk/jku/x5u are ignored)")
    func embeddedKeys() throws {
        let attacker = try AsymmetricKey.generateRSA()
        let (n, e) = try attacker.rsaComponents()
        let header =
            #"{"alg":"RS256","kid":"rsa-1","jku":"https://evil.example/keys","x5u":"https://evil.example/c","jwk":{"kty":"RSA","n":"\#(Base64URL.encode(n))","e":"\#(Base64URL.encode(e))"}}"#
        #expect(code(try token(header: header, key: attacker)) == .signatureInvalid)
    }

    @Test("crit, a missing kid, an unknown kid and a duplicate kid are refused")
    func headerRules() throws {
        #expect(code(try token(header: #"{"alg":"RS256","kid":"rsa-1","crit":["exp"],"exp":1}"#)) == .unsupportedCritical)
        #expect(code(try token(header: #"{"alg":"RS256"}"#)) == .keyNotFound)
        #expect(code(try token(header: #"{"alg":"RS256","kid":"other"}"#)) == .keyNotFound)
        let ambiguous = JWKSet(keys: [JWK(key: Self.rsa, keyID: "dup"), JWK(key: try AsymmetricKey.generateRSA(), keyID: "dup")])
        #expect(code(try token(header: #"{"alg":"RS256","kid":"dup"}"#), ambiguous) == .keyNotFound)
    }

    @Test("duplicate member names in header or claims are refused")
    func duplicates() throws {
        #expect(code(try token(header: #"{"alg":"RS256","kid":"rsa-1","alg":"none"}"#)) == .malformed)
        #expect(code(try token(header: #"{"alg":"RS256","kid":"rsa-1","k\u0069d":"x"}"#)) == .malformed)
        let twoAudiences = try token(header: #"{"alg":"RS256","kid":"rsa-1"}"#, payload: #"{"aud":"evil","aud":"good"}"#)
        let verified = try verifier.verify(twoAudiences, keys: keys)
        #expect(throws: JOSEError.self) { try verified.claims() }
    }

    @Test("over-long tokens are refused before parsing; padding and foreign characters are malformed")
    func framing() throws {
        let huge = String(repeating: "a", count: 16 * 1024 + 1)
        #expect(code(huge) == .tooLarge)
        let good = try token(header: #"{"alg":"RS256","kid":"rsa-1"}"#)
        #expect(code(good) == nil)
        #expect(code(good + "=") == .malformed)
        #expect(code(good.replacingOccurrences(of: ".", with: "+.", options: [], range: good.range(of: "."))) == .malformed)
        #expect(code(good + ".extra") == .malformed)
        #expect(code("") == .malformed)
        #expect(code("a.b") == .malformed)
        #expect(code(try token(header: #"["alg","RS256"]"#)) == .malformed)
        #expect(code(try token(header: #"{"alg":256,"kid":"rsa-1"}"#)) == .malformed)
    }

    @Test("ES256 signatures must be exactly 64 bytes: a zero-padded 66-byte r‖s is refused")
    func es256Length() throws {
        let good = try JWSSigner(key: Self.ec, keyID: "ec-1").sign(claims: ["sub": "x"])
        let parts = good.split(separator: ".").map(String.init)
        let raw = Base64URL.decode(parts[2])!
        let padded = [0] + raw[0..<32] + [0] + raw[32...]
        #expect(code(parts[0] + "." + parts[1] + "." + Base64URL.encode(padded)) == .signatureInvalid)
        let der = try ECDSASignature.der(fromRaw: raw)
        #expect(code(parts[0] + "." + parts[1] + "." + Base64URL.encode(der)) == .signatureInvalid)
    }
}

@Suite("Base64URL")
struct Base64URLTests {
    @Test("round-trips and matches RFC 4648 test vectors without padding")
    func vectors() {
        let cases = ["": "", "f": "Zg", "fo": "Zm8", "foo": "Zm9v", "foob": "Zm9vYg", "fooba": "Zm9vYmE", "foobar": "Zm9vYmFy"]
        for (plain, encoded) in cases {
            #expect(Base64URL.encode(plain) == encoded)
            #expect(Base64URL.decode(encoded) == Array(plain.utf8))
        }
        #expect(Base64URL.encode([0xFB, 0xFF]) == "-_8")
    }

    @Test("rejects padding, whitespace, the standard alphabet, impossible lengths and non-zero trailing bits")
    func strict() {
        for bad in ["Zg==", "Zm9v YmFy", "+/8", "Zm9vY", "Zh", "Zm9vYmE=", "Zm9vYmF\n"] {
            #expect(Base64URL.decode(bad) == nil, "\(bad)")
        }
    }

    @Test("decoding into caller memory needs exactly the decoded length and answers as decoding to an array does")
    func intoBuffer() {
        for text in ["Zm9vYmFy", "Zm9vYmE", "Zm9vYg", "Zh", "Zm9v YmFy", "+/8", ""] {
            let utf8 = Array(text.utf8)
            guard let count = Base64URL.decodedCount(encodedCount: utf8.count) else {
                #expect(utf8.count % 4 == 1, "\(text)")
                continue
            }
            var output = [UInt8](repeating: 0, count: count)
            let decoded = utf8.withUnsafeBufferPointer { input in
                output.withUnsafeMutableBufferPointer { Base64URL.decode(buffer: input, into: $0) }
            }
            #expect(decoded == (Base64URL.decode(text) != nil), "\(text)")
            if decoded { #expect(output == Base64URL.decode(text), "\(text)") }
            // One byte too many or too few is refused, not overrun or left half-written.
            for wrong in [count + 1, max(count - 1, 0)] where wrong != count {
                var other = [UInt8](repeating: 0, count: wrong)
                let accepted = utf8.withUnsafeBufferPointer { input in
                    other.withUnsafeMutableBufferPointer { Base64URL.decode(buffer: input, into: $0) }
                }
                #expect(!accepted, "\(text) into \(wrong) bytes")
            }
        }
        #expect(Base64URL.decodedCount(encodedCount: 5) == nil)
        #expect(Base64URL.decodedCount(encodedCount: 342) == 256)  // an RS256 signature
    }
}
