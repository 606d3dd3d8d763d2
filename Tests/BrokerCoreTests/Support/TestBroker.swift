import AppleSimulator
import BrokerAPI
import BrokerCore
import BrokerCrypto
import Foundation
import HTTPClient
import Locking
import Observability
import PostgresClient
import ProcessRunner
import Synchronization
import TestSupport
import Testing

/// Environment for a broker under test: a fresh database and throwaway Apple credentials.
enum TestEnvironment {
    /// A P-256 `.p8` written to a temporary file, as Apple hands them out.
    static func privateKeyFile() throws -> String { try TestKeys.privateKeyFile() }

    static func variables(database: PostgresConfiguration, extra: [String: String] = [:]) throws -> [String: String] {
        var environment = [
            "DATABASE_URL": database.connectionString,
            "BROKER_LISTEN": "127.0.0.1:0",
            "BROKER_LOG_LEVEL": "warning",
            "BROKER_HTTP_THREADS": "8",
            "APPLE_TEAM_ID": "TEAMID1234",
            "APPLE_KEY_ID": "KEYID12345",
            "APPLE_PRIVATE_KEY_PATH": try privateKeyFile(),
            "APPLE_CLIENT_IDS": "com.example.app,com.example.web",
            "APPLE_BASE_URL": "http://127.0.0.1:9",
            "TOKEN_ENCRYPTION_KEY": Data(SecureRandom.bytes(32)).base64EncodedString(),
            // Webhook receivers in tests listen on loopback (SecurityTests turn this off).
            "BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true",
        ]
        // Two client ids need their grouping said (APPLE_APP_GROUPS, protocol reference §12.6): the
        // app and its web Services ID are one group, as at Apple. A test naming its own client ids
        // names their groups too.
        if extra["APPLE_CLIENT_IDS"] == nil { environment["APPLE_APP_GROUPS"] = "com.example.app=com.example.web" }
        environment.merge(extra) { $1 }
        return environment
    }
}

/// A broker running in this process on a free port, against its own database, talking to
/// an Apple simulator of its own that knows the broker's team key.
final class TestBroker: Sendable {
    static let teamID = "TEAMID1234"
    static let clientID = "com.example.app"
    static let webClientID = "com.example.web"

    let application: BrokerApplication
    let simulator: AppleSimulator
    let environment: [String: String]
    let client = CurlTransport()
    let logs: LogSink

    var baseURL: String { "http://127.0.0.1:\(application.port)" }
    var pool: PostgresPool { application.database.pool }

    /// Every role, for tests of what the roles do together.
    static let allRoles = Set(BrokerConfiguration.Role.allCases)

    /// - Parameters:
    ///   - roles: the parts this broker runs (`BROKER_ROLES`). Default the API alone: a test that
    ///     needs the notification endpoint or a worker (deletion, dispatch, sweep) names it, so
    ///     no test pays for idle workers polling its database.
    ///   - appleBaseURL: where the broker finds Apple; default the simulator.
    init(
        database: PostgresConfiguration? = nil, roles: Set<BrokerConfiguration.Role> = [.api], extra: [String: String] = [:],
        appleBaseURL: String? = nil
    ) throws {
        precondition(extra["BROKER_ROLES"] == nil, "pass roles:, not BROKER_ROLES")
        simulator = try AppleSimulator(logger: Logger(label: "sim", sink: .capturing(level: .warning)))
        try simulator.start()
        var variables = extra
        variables["APPLE_BASE_URL"] = appleBaseURL ?? simulator.baseURL
        variables["BROKER_ROLES"] = roles.sorted().map(\.rawValue).joined(separator: ",")
        environment = try TestEnvironment.variables(database: database ?? TestPostgres.freshDatabase(), extra: variables)
        let pem = try String(contentsOfFile: environment["APPLE_PRIVATE_KEY_PATH"]!, encoding: .utf8)
        simulator.registerTeam(
            teamID: Self.teamID, keyID: environment["APPLE_KEY_ID"]!, publicKey: try AppleSimulator.publicKey(fromPEM: pem),
            clientIDs: [Self.clientID, Self.webClientID])
        let configuration = try BrokerConfiguration.load(environment: environment, requireApple: true)
        logs = LogSink.capturing(level: .info)
        application = try BrokerApplication(configuration: configuration, logger: Logger(label: "broker", sink: logs))
        try application.start()
    }

    deinit {
        application.stop()
        simulator.stop()
    }

    /// Mints an identity token at the simulator.
    func mint(_ configure: (inout TokenRequest) -> Void = { _ in }) throws -> MintedToken {
        var request = TokenRequest(clientID: Self.clientID)
        request.teamID = Self.teamID
        configure(&request)
        return try simulator.mintToken(request)
    }

    /// `POST /v1/apple/login` with a login-scoped key.
    func login(_ body: [String: Any], key: String? = nil) throws -> HTTPClientResponse {
        let data = try JSONSerialization.data(withJSONObject: body)
        return try post("/v1/apple/login", json: String(decoding: data, as: UTF8.self), key: key ?? loginKey())
    }

    private let cachedKeys = Lock<[Set<Scope>: String]>([:])

    /// One key per scope set, created on first use.
    func key(_ scopes: Set<Scope>) throws -> String {
        if let key = cachedKeys.withLock({ $0[scopes] }) { return key }
        let key = try apiKey(scopes)
        cachedKeys.withLock { $0[scopes] = key }
        return key
    }

    func loginKey() throws -> String { try key([.login]) }

    /// Signs one user in with an authorization code for each client id (a refresh token
    /// each); returns its id and sub.
    func signIn(clients: [String] = [TestBroker.clientID]) throws -> (id: UUID, sub: String) {
        var sub: String?
        var userID: UUID?
        for clientID in clients {
            let minted = try mint {
                $0.clientID = clientID
                $0.withCode = true
                $0.sub = sub
            }
            let response = try login(["identity_token": minted.idToken, "authorization_code": minted.code!])
            #expect(response.status == 200, "\(response.bodyText)")
            sub = minted.sub
            userID = UUID(uuidString: response.json["user_id"] as! String)
        }
        return (userID!, sub!)
    }

    /// The keyed hash the broker keeps for a sub of its team (tombstones, inbox, audit).
    func subjectHash(_ sub: String) throws -> String {
        SubjectHasher(keys: try TokenKeyRing(parsing: environment["TOKEN_ENCRYPTION_KEY"]!)).hash(teamID: Self.teamID, sub: sub)
    }

    /// A single integer from SQL.
    func count(_ query: PostgresQuery) throws -> Int {
        try pool.query(query).single().decode(Int.self, 0)
    }

    /// A new API key with these scopes.
    func apiKey(_ scopes: Set<Scope>, name: String = "test") throws -> String {
        try APIKeyStore(pool: pool).create(name: name, scopes: scopes).secret
    }

    func get(_ path: String, key: String? = nil) throws -> HTTPClientResponse {
        try client.send(.init(url: baseURL + path, headers: key.map { [("Authorization", "Bearer \($0)")] } ?? []))
    }

    func post(_ path: String, json: String, key: String? = nil) throws -> HTTPClientResponse {
        var headers = [("Content-Type", "application/json")]
        if let key { headers.append(("Authorization", "Bearer \(key)")) }
        return try client.send(.init(method: "POST", url: baseURL + path, headers: headers, body: Array(json.utf8)))
    }
}

extension HTTPClientResponse {
    /// The body as a JSON object.
    var json: [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] ?? [:]
    }
}

/// The `appleid-broker` executable built beside this test binary.
enum BrokerExecutable {
    static var path: String {
        let testBinary =
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var directory = (testBinary as NSString).deletingLastPathComponent
        // …/debug/appleid-brokerPackageTests.xctest may itself be a directory on some layouts.
        if directory.hasSuffix(".xctest") { directory = (directory as NSString).deletingLastPathComponent }
        return directory + "/appleid-broker"
    }

    /// Runs the CLI to completion; stdout and stderr separately.
    static func run(_ arguments: [String], environment: [String: String]) throws -> (
        status: Int32, stdout: String, stderr: String
    ) {
        let directory = TestFiles.path("cli")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // The shell keeps the two streams apart; ChildProcess.run merges them.
        let quoted = ([path] + arguments).map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }.joined(
            separator: " ")
        let result = try ChildProcess.run(
            "/bin/sh", ["-c", "\(quoted) 2>\(directory)/stderr"], environment: environment)
        let stderr = (try? String(contentsOfFile: directory + "/stderr", encoding: .utf8)) ?? ""
        return (result.status, result.output, stderr)
    }
}
