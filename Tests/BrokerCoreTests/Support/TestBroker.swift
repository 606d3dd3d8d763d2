import BrokerCore
import BrokerCrypto
import Foundation
import HTTPClient
import Observability
import PostgresClient
import ProcessRunner
import TestSupport

/// Environment for a broker under test: a fresh database and throwaway Apple credentials.
enum TestEnvironment {
    /// A P-256 `.p8` written to a temporary file, as Apple hands them out.
    static func privateKeyFile() throws -> String {
        let path = NSTemporaryDirectory() + "abk-key-\(UUID().uuidString).p8"
        try AsymmetricKey.generateP256().privateKeyPEM().write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

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
        ]
        environment.merge(extra) { $1 }
        return environment
    }
}

/// A broker running in this process on a free port, against its own database.
final class TestBroker {
    let application: BrokerApplication
    let environment: [String: String]
    let client = CurlTransport()
    let logs: LogSink

    var baseURL: String { "http://127.0.0.1:\(application.port)" }
    var pool: PostgresPool { application.database.pool }

    init(database: PostgresConfiguration? = nil, extra: [String: String] = [:]) throws {
        environment = try TestEnvironment.variables(database: database ?? TestPostgres.freshDatabase(), extra: extra)
        let configuration = try BrokerConfiguration.load(environment: environment, requireApple: true)
        logs = LogSink.capturing(level: .info)
        application = try BrokerApplication(configuration: configuration, logger: Logger(label: "broker", sink: logs))
        try application.start()
    }

    deinit { application.stop() }

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
        let testBinary = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var directory = (testBinary as NSString).deletingLastPathComponent
        // …/debug/appleid-brokerPackageTests.xctest may itself be a directory on some layouts.
        if directory.hasSuffix(".xctest") { directory = (directory as NSString).deletingLastPathComponent }
        return directory + "/appleid-broker"
    }

    /// Runs the CLI to completion; stdout and stderr separately.
    static func run(_ arguments: [String], environment: [String: String]) throws -> (status: Int32, stdout: String, stderr: String) {
        let directory = NSTemporaryDirectory() + "abk-cli-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // The shell keeps the two streams apart; ChildProcess.run merges them.
        let quoted = ([path] + arguments).map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }.joined(separator: " ")
        let result = try ChildProcess.run(
            "/bin/sh", ["-c", "\(quoted) 2>\(directory)/stderr"], environment: environment)
        let stderr = (try? String(contentsOfFile: directory + "/stderr", encoding: .utf8)) ?? ""
        return (result.status, result.output, stderr)
    }
}
