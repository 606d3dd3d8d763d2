import AppleID
import BrokerAPI
import BrokerCore
import BrokerCrypto
import Foundation
import JOSE
import Locking
import Observability
import Synchronization
import TestSupport
import Testing

/// The `.p8` hot reload: a rotated key takes effect without a restart, a broken one never
/// replaces the last good key.
@Suite("Client secrets")
struct ClientSecretProviderTests {
    /// A clock the test moves.
    final class Clock: Sendable {
        private let current = Lock(Date())
        var now: Date { current.withLock { $0 } }
        func advance(_ seconds: TimeInterval) { current.withLock { $0 += seconds } }
    }

    private func keyIDFile(_ text: String) throws -> String {
        let path = TestFiles.path("kid")
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    private func signedKeyID(_ secret: String) throws -> String? {
        try JWSVerifier(maximumBytes: 8192).unverifiedHeader(secret).keyID
    }

    @Test("a changed .p8 that does not load keeps the last good key, logged and counted once; a good one takes over")
    func brokenReloadKeepsLastGoodKey() throws {
        let keyPath = try TestKeys.privateKeyFile()
        let keyIDPath = try keyIDFile("KEYID00001")
        let clock = Clock()
        let metrics = MetricsRegistry()
        let logs = LogSink.capturing(level: .info)
        let provider = ClientSecretProvider(
            teamID: "TEAMID1234", keyID: "unused", keyPath: keyPath, keyIDPath: keyIDPath, metrics: metrics,
            logger: Logger(label: "apple", sink: logs), now: { clock.now })
        #expect(try signedKeyID(try provider.secret(for: "com.example.app")) == "KEYID00001")

        // A deploy writes half a key (or the wrong kind) and a new key id.
        try "-----BEGIN PRIVATE KEY-----\nnot a key\n".write(toFile: keyPath, atomically: true, encoding: .utf8)
        try "KEYID00002".write(toFile: keyIDPath, atomically: true, encoding: .utf8)
        for _ in 0..<3 {
            clock.advance(6)
            // Still signing with the last good key and its id: Apple calls keep working.
            #expect(try signedKeyID(try provider.secret(for: "com.example.web")) == "KEYID00001")
        }
        #expect(metrics.render().contains("apple_key_reload_failures_total 1"))
        #expect(logs.capturedLines.filter { $0.contains("keeping the last good key") }.count == 1)

        // The fixed key takes effect on the next check.
        try AsymmetricKey.generateP256().privateKeyPEM().write(toFile: keyPath, atomically: true, encoding: .utf8)
        clock.advance(6)
        #expect(try signedKeyID(try provider.secret(for: "com.example.app")) == "KEYID00002")
    }

    @Test("with no good key ever loaded, a broken .p8 is an error")
    func brokenFromTheStart() throws {
        let keyPath = TestFiles.path("bad", suffix: ".p8")
        try "garbage".write(toFile: keyPath, atomically: true, encoding: .utf8)
        let provider = ClientSecretProvider(teamID: "TEAMID1234", keyID: "KEYID00001", keyPath: keyPath)
        #expect(throws: (any Error).self) { try provider.secret(for: "com.example.app") }
    }
}
