// broker-bench: micro-benchmarks of the broker's hot paths, printed as figures (not tests),
// and fixtures for the benchmark scripts.
//   broker-bench [verify] [--seconds 3] [--json]   RSA verify, claims parsing and full identity-token
//                                                  validation per user-CPU second (as openssl speed
//                                                  counts) and per wall second, on one thread;
//                                                  --interleaved alternates 10 ms slices of openssl
//                                                  speed's verify operation, bare RSA, and each layer
//                                                  of validation instead, and prints their ratios
//   broker-bench seed-tokens --users N             N users, each with an identity and a sealed refresh
//                                                  token (DATABASE_URL, TOKEN_ENCRYPTION_KEY, APPLE_TEAM_ID)
//   broker-bench receive --listen 127.0.0.1:PORT   a webhook receiver that answers 204 to every POST
//                                                  and prints the count on SIGTERM/SIGINT
//   broker-bench pace --url URL --bodies FILE --rate R --seconds S [--threads 16]
//                                                  POSTs the JSON bodies (one per line) at a fixed
//                                                  rate, open loop, and prints the latency figures
import AppleID
import BrokerAPI
import BrokerCore
import BrokerCrypto
import Foundation
import HTTPClient
import HTTPServer
import JOSE
import Locking
import Observability
import PostgresClient
import StrictJSON
import Synchronization

switch CommandLine.arguments.dropFirst().first {
case "seed-tokens": exit(seedTokens())
case "receive": exit(receive())
case "pace": exit(pace())
default: break
}

/// A key provider with one fixed key (no network, no cache).
struct StaticKeys: AppleKeyProvider {
    let key: JWK
    func key(id keyID: String) throws -> JWK {
        guard keyID == key.keyID else { throw AppleKeyError.unknownKey }
        return key
    }
}

/// User CPU time of this process, in seconds: the divisor `openssl speed` uses by default
/// (its `-elapsed` switches to wall time), so a preempted or stolen slice of this VM's core
/// counts against neither side.
func userCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6
}

extension Duration {
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}

/// Operations per user-CPU second and per wall second.
struct Rate {
    var perCPUSecond: Double
    var perWallSecond: Double
}

func measure(_ name: String, seconds: Double, _ body: () throws -> Void) rethrows -> Rate {
    // `--only <word>` runs just the benchmarks whose name contains it (for profiling one).
    if interleaved || only.map({ !name.contains($0) }) == true { return Rate(perCPUSecond: 0, perWallSecond: 0) }
    // Warm up, then count operations for `seconds`.
    for _ in 0..<200 { try body() }
    var operations = 0
    let start = ContinuousClock.now
    let startCPU = userCPUSeconds()
    let limit = Duration.milliseconds(Int(seconds * 1000))
    while ContinuousClock.now - start < limit {
        for _ in 0..<100 { try body() }
        operations += 100
    }
    let elapsed = ContinuousClock.now - start
    let cpu = userCPUSeconds() - startCPU
    let wall = elapsed.seconds
    let rate = Rate(perCPUSecond: Double(operations) / cpu, perWallSecond: Double(operations) / wall)
    print(
        String(
            format: "%-34@ %10.0f /s CPU  %8.2f us/op   (%.0f /s wall)", name as NSString, rate.perCPUSecond,
            1e6 / rate.perCPUSecond, rate.perWallSecond))
    return rate
}

let arguments = CommandLine.arguments.dropFirst()
let seconds = Double(arguments.firstIndex(of: "--seconds").map { arguments[$0 + 1] } ?? "3") ?? 3
let json = arguments.contains("--json")
let only = arguments.firstIndex(of: "--only").map { arguments[$0 + 1] }
let interleaved = arguments.contains("--interleaved")

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
_ = try measure("claims JSON parse (dictionary)", seconds: seconds) { _ = try JSONValue.parseObject(claimsBytes) }
_ = try measure("claims JSON parse (Apple's claims)", seconds: seconds) {
    _ = try AppleClaims(payload: claimsBytes, leeway: 60, now: Double(now))
}
let encodedPayload = Array(tokens[0].split(separator: ".")[1].utf8)
let encodedSignature = Array(tokens[0].split(separator: ".")[2].utf8)
_ = measure("base64url decode payload + signature", seconds: seconds) {
    precondition(Base64URL.decode(utf8: encodedPayload) != nil && Base64URL.decode(utf8: encodedSignature) != nil)
}
let validateNext = { () throws in
    index = (index + 1) & 255
    _ = try validator.validate(tokens[index], rawNonce: nil)
}
let fullRate = try measure("identity token validate (full)", seconds: seconds, validateNext)
if interleaved {
    // 10 ms slices of each layer in turn: the machine's drifting speed hits all alike, so
    // the per-operation times show what each layer adds to the RSA operation itself.
    let jws = JWSVerifier(maximumBytes: 16 * 1024, allowedAlgorithms: [.rs256])
    let apple = AppleTokenVerifier(keys: StaticKeys(key: jwk))
    var layer = 0
    let speedReplica = try OpenSSLSpeedReplica(key: rsa)
    let layers: [(name: String, run: () throws -> Void)] = [
        ("openssl speed's verify (36 bytes, no hash)", { precondition(speedReplica.verify()) }),
        ("bare RSA verify (SHA-256 + EVP)", { precondition(rsa.verifySHA256(signature: signature, message: signingInput)) }),
        (
            "+ JWS framing (split, base64url, header)",
            {
                layer = (layer + 1) & 255
                _ = try jws.verify(tokens[layer], key: jwk)
            }
        ),
        (
            "+ kid lookup and strict claims JSON check",
            {
                layer = (layer + 1) & 255
                _ = try apple.claims(of: tokens[layer], leeway: 60, now: Double(now))
            }
        ),
        ("+ every claim check (full validation)", validateNext),
    ]
    var counts = [Int](repeating: 0, count: layers.count)
    var time = [Duration](repeating: .zero, count: layers.count)
    let end = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
    while ContinuousClock.now < end {
        for (index, layer) in layers.enumerated() {
            let start = ContinuousClock.now
            while ContinuousClock.now - start < .milliseconds(10) {
                for _ in 0..<10 { try layer.run() }
                counts[index] += 10
            }
            time[index] += ContinuousClock.now - start
        }
    }
    let microseconds = layers.indices.map { time[$0].seconds * 1e6 / Double(counts[$0]) }
    for (index, layer) in layers.enumerated() {
        print(
            String(
                format: "interleaved: %-42@ %7.2f us/op  %6.3f of openssl speed's op  %6.3f of bare RSA",
                layer.name as NSString, microseconds[index], microseconds[0] / microseconds[index],
                microseconds[1] / microseconds[index]))
    }
    let full = microseconds[layers.count - 1]
    if json {
        print("{\"validate_to_openssl_speed_op\":\(microseconds[0] / full),\"validate_to_rsa_verify\":\(microseconds[1] / full)}")
    }
} else if json {
    print(
        "{\"rsa2048_verify_per_cpu_s\":\(Int(rsaRate.perCPUSecond)),\"jwt_verify_per_cpu_s\":\(Int(fullRate.perCPUSecond)),"
            + "\"jwt_verify_per_wall_s\":\(Int(fullRate.perWallSecond))}")
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
            let sealed = try SealedAppleToken(
                sealing: "r\(Hex.encode(SecureRandom.bytes(16))).0.seed", as: .refresh,
                for: .init(teamID: teamID, sub: sub, clientID: clientID), keys: keys)
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

/// The far end of the webhook benchmark: as cheap a receiver as the HTTP server allows, so
/// the figures measure the dispatcher.
func receive() -> Int32 {
    let arguments = Array(CommandLine.arguments.dropFirst(2))
    var blocked = sigset_t()
    sigemptyset(&blocked)
    sigaddset(&blocked, SIGTERM)
    sigaddset(&blocked, SIGINT)
    pthread_sigmask(SIG_BLOCK, &blocked, nil)
    var configuration = HTTPServer.Configuration()
    configuration.listen = arguments.firstIndex(of: "--listen").map { arguments[$0 + 1] } ?? "127.0.0.1:18409"
    configuration.accessLog = false
    configuration.workerThreads = 16
    let received = Atomic<Int>(0)
    var router = Router()
    router.post("/hook") { _ in
        received.add(1, ordering: .relaxed)
        return .noContent
    }
    let server = HTTPServer(
        configuration: configuration, router: router, logger: Logger(label: "receiver", sink: LogSink(level: .warning)),
        metrics: MetricsRegistry())
    do { try server.start() } catch {
        FileHandle.standardError.write(Data("receive: \(error)\n".utf8))
        return 1
    }
    var signal: Int32 = 0
    sigwait(&blocked, &signal)
    server.shutdown()
    print("received \(received.load(ordering: .relaxed))")
    return 0
}

/// An open-loop load generator: request i is due at start + i / rate whatever happened to
/// the ones before (so a slow server shows up as latency, not as a lower offered rate).
/// Latency is measured from the due time, which counts queueing on our side too.
func pace() -> Int32 {
    let arguments = Array(CommandLine.arguments.dropFirst(2))
    func option(_ name: String) -> String? { arguments.firstIndex(of: "--" + name).map { arguments[$0 + 1] } }
    guard let url = option("url"), let file = option("bodies"), let rate = option("rate").flatMap(Double.init),
        let seconds = option("seconds").flatMap(Double.init), rate > 0, seconds > 0,
        let text = try? String(contentsOfFile: file, encoding: .utf8)
    else {
        FileHandle.standardError.write(
            Data("pace --url URL --bodies FILE --rate R --seconds S [--threads N] [--header 'Name: value']\n".utf8))
        return 2
    }
    let bodies = text.split(separator: "\n").map { Array($0.utf8) }
    let total = min(bodies.count, Int(rate * seconds))
    let extra = option("header").flatMap { header in
        header.firstIndex(of: ":").map {
            (String(header[..<$0]), header[header.index(after: $0)...].trimmingCharacters(in: .whitespaces))
        }
    }
    let headers = [("Content-Type", "application/json")] + (extra.map { [$0] } ?? [])
    let threads = option("threads").flatMap(Int.init) ?? 16
    let next = Atomic<Int>(0)
    let results = Lock<(latencies: [Double], failures: Int)>(([], 0))
    let transport = CurlTransport()
    let start = ContinuousClock.now
    let group = DispatchGroup()
    for _ in 0..<threads {
        let thread = Thread {
            var latencies: [Double] = []
            var failures = 0
            while true {
                let index = next.add(1, ordering: .relaxed).oldValue
                guard index < total else { break }
                let due = start + .nanoseconds(Int64(Double(index) / rate * 1e9))
                let wait = due - ContinuousClock.now
                if wait > .zero {
                    Thread.sleep(forTimeInterval: Double(wait.components.attoseconds) / 1e18 + Double(wait.components.seconds))
                }
                let request = HTTPClientRequest(
                    method: "POST", url: url, headers: headers, body: bodies[index], timeout: .seconds(30))
                let status = (try? transport.send(request).status) ?? 0
                if !(200..<300).contains(status) { failures += 1 }
                let elapsed = ContinuousClock.now - due
                latencies.append(Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15)
            }
            results.withLock {
                $0.latencies += latencies
                $0.failures += failures
            }
            group.leave()
        }
        group.enter()
        thread.start()
    }
    group.wait()
    let elapsed = ContinuousClock.now - start
    let wall = elapsed.seconds
    let (latencies, failures) = results.withLock { ($0.latencies.sorted(), $0.failures) }
    func percentile(_ p: Double) -> Double {
        latencies.isEmpty ? 0 : latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))]
    }
    print(
        String(
            format:
                "{\"requests\":%d,\"failures\":%d,\"offered_rate\":%.1f,\"achieved_rate\":%.1f,\"p50_ms\":%.2f,\"p99_ms\":%.2f}",
            latencies.count, failures, rate, Double(latencies.count) / wall, percentile(0.5), percentile(0.99)))
    return failures == 0 ? 0 : 1
}
