// broker-bench: micro-benchmarks of the broker's hot paths, printed as figures (not tests),
// and fixtures for the benchmark scripts.
//   broker-bench [verify] [--seconds 3] [--json]   RSA verify, claims parsing and full identity-token
//                                                  validation per second, on one thread
//   broker-bench seed-tokens --users N             N users, each with an identity and a sealed refresh
//                                                  token (DATABASE_URL, TOKEN_ENCRYPTION_KEY, APPLE_TEAM_ID)
import BrokerCore
import BrokerCrypto
import Foundation
import JOSE
import PostgresClient
import StrictJSON

if CommandLine.arguments.dropFirst().first == "seed-tokens" {
    exit(seedTokens())
}

/// A key provider with one fixed key (no network, no cache).
struct StaticKeys: AppleKeyProvider {
    let key: JWK
    func key(id keyID: String) throws -> JWK {
        guard keyID == key.keyID else { throw AppleKeyError.unknownKey }
        return key
    }
}

func measure(_ name: String, seconds: Double, _ body: () throws -> Void) rethrows -> Double {
    // `--only <word>` runs just the benchmarks whose name contains it (for profiling one).
    if let only, !name.contains(only) { return 0 }
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
let only = arguments.firstIndex(of: "--only").map { arguments[$0 + 1] }

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

/// Inserts users with identities and sealed refresh tokens, as logins with a code would
/// leave them, for the deletion benchmark.
func seedTokens() -> Int32 {
    let arguments = Array(CommandLine.arguments.dropFirst(2))
    let users = arguments.firstIndex(of: "--users").flatMap { Int(arguments[$0 + 1]) } ?? 1000
    let environment = ProcessInfo.processInfo.environment
    guard let url = environment["DATABASE_URL"], let keyText = environment["TOKEN_ENCRYPTION_KEY"],
        let teamID = environment["APPLE_TEAM_ID"]
    else {
        FileHandle.standardError.write(Data("seed-tokens needs DATABASE_URL, TOKEN_ENCRYPTION_KEY and APPLE_TEAM_ID\n".utf8))
        return 2
    }
    let clientID = environment["APPLE_CLIENT_IDS"]?.split(separator: ",").first.map(String.init) ?? "com.example.app"
    do {
        let keys = try TokenKeyRing(parsing: keyText)
        let connection = try PostgresConnection(configuration: try PostgresConfiguration(connectionString: url))
        try connection.execute("BEGIN")
        for index in 0..<users {
            let userID = UUID()
            let identityID = UUID()
            let sub = "001234.seed\(index).\(Hex.encode(SecureRandom.bytes(8)))"
            let sealed = try keys.seal(
                Array("r\(Hex.encode(SecureRandom.bytes(16))).0.seed".utf8),
                associatedData: RefreshTokenSealing.associatedData(teamID: teamID, sub: sub, clientID: clientID))
            try connection.query("INSERT INTO users (id) VALUES (\(userID))")
            try connection.query(
                """
                INSERT INTO apple_identities (id, user_id, team_id, sub, client_id, last_login_at)
                VALUES (\(identityID), \(userID), \(teamID), \(sub), \(clientID), now())
                """)
            try connection.query(
                """
                INSERT INTO apple_tokens (id, identity_id, user_id, client_id, refresh_token, key_id)
                VALUES (\(UUID()), \(identityID), \(userID), \(clientID), \(sealed.sealed), \(sealed.keyID))
                """)
        }
        try connection.execute("COMMIT")
        print("seeded \(users) users with refresh tokens")
        return 0
    } catch {
        FileHandle.standardError.write(Data("seed-tokens failed: \(error)\n".utf8))
        return 1
    }
}
