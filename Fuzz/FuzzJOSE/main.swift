import BrokerCrypto
import FuzzDriver
import JOSE
import StrictJSON

// libFuzzer target: compact JWS verification (and the header, base64url and JSON parsing
// under it) and JWK / JWK Set parsing. The first byte picks which; the rest is the input.
// Nothing may crash, hang or leak; every outcome is a value or a thrown JOSEError.

private let trustedKey = JWK(key: try! AsymmetricKey.generateRSA(), keyID: "fuzz-rsa")
private let trustedKeys = JWKSet(keys: [trustedKey, JWK(key: try! AsymmetricKey.generateP256(), keyID: "fuzz-ec")])
private let verifier = JWSVerifier()

runFuzzer { input in
    let bytes = Array(input)
    guard let mode = bytes.first else { return }
    let input = Array(bytes.dropFirst())
    switch mode % 3 {
    case 0:
        let token = String(decoding: input, as: UTF8.self)
        if let verified = try? verifier.verify(token, keys: trustedKeys) {
            _ = try? verified.claims()
        }
        _ = try? verifier.unverifiedHeader(token)
    case 1:
        _ = try? JWK(json: input)
    default:
        _ = try? JWKSet(json: input)
    }
}
