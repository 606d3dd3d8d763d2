import BrokerCrypto
import Foundation
import FuzzDriver
import JOSE
import StrictJSON

// libFuzzer target: compact JWS verification (and the header, base64url and JSON parsing
// under it) and JWK / JWK Set parsing. The first byte picks which; the rest is the input.
// Nothing may crash, hang or leak; every outcome is a value or a thrown JOSEError.

// Fixed public keys (no private half anywhere), not fresh ones: the key bytes reach compares the
// fuzzer learns from, so a run with a fixed -seed and -runs repeats itself only with fixed keys.
private let rsaDER =
    "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAvykxyEkg8STmaA94ZfJPKJIsH44CKEotL2ns/ypSpjdMypgUsnF4qgXrpc4rZsmRiVRZFLYG"
    + "6yHrLiaLFMUPAg/ddtyR/6+mr5GxTtoR47oUFGWptv0g0ubRlOeQh/+hggzHEfs0Q+9xJ2jWwkKSRFTNwkjFNeJRX6zwdbJGESA1ypKHKUj0pn0ij1vh"
    + "N5B8XqkfaMZY7GxkFMHTD6+mNrysJMZ172vrBwmd2JXxMJUCJQAjdGHZ7wpWPM+LMVuwqr1645IV3x79sk7ajy4wSDIfJz5uANZAMdOe0YpFxanXzmHE"
    + "tp5SJsVw/lzVmf1vyeN7z1QvdUEHVhlO/0rYPQIDAQAB"
private let p256DER =
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEVLW8z5uGzcv0LxBlDfV/h9HTW9VF9pXTNwZ6p7uGoZ/dVhtsB65AfvJLDVz9pPlw8/ZypmUn1zgdqV0ma9TjGw=="
private func publicKey(_ base64: String) -> AsymmetricKey {
    try! AsymmetricKey.publicKey(der: Array(Data(base64Encoded: base64)!))
}
private let trustedKey = JWK(key: publicKey(rsaDER), keyID: "fuzz-rsa")
private let trustedKeys = JWKSet(keys: [trustedKey, JWK(key: publicKey(p256DER), keyID: "fuzz-ec")])
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
