// broker-bench: micro-benchmarks of the broker's hot paths, printed as figures (not tests).
//   broker-bench verify [--seconds 3]    full identity-token validation per second, one thread
import BrokerCore
import BrokerCrypto
import Foundation
import JOSE
import StrictJSON

/// A key provider with one fixed key (no network, no cache).
struct StaticKeys: AppleKeyProvider {
    let key: JWK
    func key(id keyID: String) throws -> JWK {
        guard keyID == key.keyID else { throw AppleKeyError.unknownKey }
        return key
    }
}

func measure(_ name: String, seconds: Double, _ body: () throws -> Void) rethrows -> Double {
    // Warm up, then count operations for `seconds`.
    for _ in 0..<200 { try body() }
    var operations = 0
    let start = ContinuousClock.now
    let limit = Duration.milliseconds(Int(seconds * 1000))
    while ContinuousClock.now - start < limit {
        for _ in 0..<100 { try body() }
        operations += 100
    }
    let elapsed = ContinuousClock.now - start
    let rate = Double(operations) / (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
    print(String(format: "%-34@ %10.0f /s  %8.2f us/op", name as NSString, rate, 1e6 / rate))
    return rate
}

let arguments = CommandLine.arguments.dropFirst()
let seconds = Double(arguments.firstIndex(of: "--seconds").map { arguments[$0 + 1] } ?? "3") ?? 3
let json = arguments.contains("--json")

let rsa = try AsymmetricKey.generateRSA()
let jwk = JWK(key: rsa, keyID: "bench-key")
let signer = try JWSSigner(key: rsa, keyID: "bench-key")
let now = Int64(Date().timeIntervalSince1970)
let tokens: [String] = try (0..<256).map { index in
    try signer.sign(claims: [
        "iss": "https://appleid.apple.com", "aud": "com.example.app", "sub": .string("001234.\(index).0042"),
        "iat": .integer(now), "exp": .integer(now + 3600), "auth_time": .integer(now),
        "email": .string("u\(index)@privaterelay.appleid.com"), "email_verified": true, "is_private_email": true,
        "real_user_status": 2, "nonce_supported": true, "c_hash": "kW2bcFvCzFx1iDVPfgW3Kw",
    ])
}
let validator = IdentityTokenValidator(
    verifier: AppleTokenVerifier(keys: StaticKeys(key: jwk)), clientIDs: ["com.example.app"])
var index = 0
let signingInput = Array(tokens[0].split(separator: ".").prefix(2).joined(separator: ".").utf8)
let signature = Base64URL.decode(String(tokens[0].split(separator: ".")[2]))!
let claimsBytes = Base64URL.decode(String(tokens[0].split(separator: ".")[1]))!

let rsaRate = measure("RSA-2048 verify (EVP_PKEY_verify)", seconds: seconds) {
    precondition(rsa.verifySHA256(signature: signature, message: signingInput))
}
_ = try measure("claims JSON parse", seconds: seconds) { _ = try JSONValue.parseObject(claimsBytes) }
let fullRate = try measure("identity token validate (full)", seconds: seconds) {
    index = (index + 1) & 255
    _ = try validator.validate(tokens[index], rawNonce: nil)
}
if json {
    print("{\"rsa2048_verify_per_s\":\(Int(rsaRate)),\"jwt_verify_per_s\":\(Int(fullRate))}")
}
