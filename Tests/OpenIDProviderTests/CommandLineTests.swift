import BrokerCore
import BrokerCrypto
import Foundation
import HTTPClient
import JOSE
import PostgresClient
import ProcessRunner
import StrictJSON
import TestSupport
import Testing

@testable import OpenIDProvider

/// `appleid-broker oidc-keys` and `oidc-clients`, and `reencrypt` over the provider's keys,
/// run as the executable against a running provider's database.
@Suite("OpenID Provider command line", .offPool)
struct CommandLineTests {
    /// The `appleid-broker` built beside this test binary; stdout and stderr apart.
    static func run(_ arguments: [String], environment: [String: String]) throws -> (
        status: Int32, stdout: String, stderr: String
    ) {
        let testBinary =
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var directory = (testBinary as NSString).deletingLastPathComponent
        if directory.hasSuffix(".xctest") { directory = (directory as NSString).deletingLastPathComponent }
        let errors = TestFiles.path("oidc-cli")
        defer { try? FileManager.default.removeItem(atPath: errors) }
        let quoted = ([directory + "/appleid-broker"] + arguments).map {
            "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'"
        }
        let result = try ChildProcess.run(
            "/bin/sh", ["-c", quoted.joined(separator: " ") + " 2>\(errors)"], environment: environment)
        return (result.status, result.output, (try? String(contentsOfFile: errors, encoding: .utf8)) ?? "")
    }

    @Test("oidc-clients create|list|delete and oidc-keys rotate|list work on the provider's database")
    func commands() throws {
        let harness = try ProviderHarness()
        let created = try Self.run(
            [
                "oidc-clients", "create", "--redirect-uris", "https://rp.example.com/cb", "--name", "CLI RP", "--grant-types",
                "authorization_code,refresh_token",
            ], environment: harness.environment)
        #expect(created.status == 0, "\(created.stderr)")
        let registration = try JSONValue.parseObject(Array(created.stdout.utf8))
        let clientID = try #require(registration["client_id"]?.stringValue)
        let secret = try #require(registration["client_secret"]?.stringValue)
        // The client works at once against the running provider.
        let client = ProviderHarness.RegisteredClient(id: clientID, secret: secret, redirectURI: "https://rp.example.com/cb")
        let code = try #require(
            try harness.signIn([
                ("response_type", "code"), ("client_id", clientID), ("redirect_uri", client.redirectURI),
                ("scope", "openid"),
            ]).query["code"])
        #expect(
            try harness.token(
                [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)], as: client
            ).status == 200)

        let refused = try Self.run(
            ["oidc-clients", "create", "--redirect-uris", "http://rp.example.com/cb"], environment: harness.environment)
        #expect(refused.status == 2)
        #expect(refused.stderr.contains("invalid_redirect_uri"), "\(refused.stderr)")

        let listed = try Self.run(["oidc-clients", "list"], environment: harness.environment)
        #expect(listed.stdout.contains(clientID) && listed.stdout.contains("CLI RP"))
        #expect(!listed.stdout.contains(secret), "the secret is shown once")

        let rotated = try Self.run(["oidc-keys", "rotate"], environment: harness.environment)
        #expect(rotated.status == 0, "\(rotated.stderr)")
        let kid = rotated.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let keys = try Self.run(["oidc-keys", "list"], environment: harness.environment)
        #expect(keys.stdout.contains("\(kid)\tpending"), "\(keys.stdout)")
        #expect(keys.stdout.contains("\tactive\t"))

        // A resource server for a relying party that is not registered: a usage error, as before.
        let unknown = try Self.run(
            ["oidc-resource-servers", "create", "--client-ids", "oidc_nope"], environment: harness.environment)
        #expect(unknown.status == 2, "\(unknown.stderr)")
        #expect(unknown.stderr.contains("registered relying party"), "\(unknown.stderr)")
        let server = try Self.run(
            ["oidc-resource-servers", "create", "--client-ids", clientID], environment: harness.environment)
        #expect(server.status == 0, "\(server.stderr)")
        #expect(try JSONValue.parseObject(Array(server.stdout.utf8))["secret"]?.stringValue != nil)

        #expect(try Self.run(["oidc-clients", "delete", clientID], environment: harness.environment).status == 0)
        #expect(try Self.run(["oidc-clients", "delete", clientID], environment: harness.environment).status == 1)
        #expect(try harness.count("SELECT count(*) FROM oidc_grants") == 0, "its grants went with it")
    }

    @Test("reencrypt re-seals the signing keys, so the old TOKEN_ENCRYPTION_KEY can go")
    func reencrypt() throws {
        let harness = try ProviderHarness(extra: [
            "TOKEN_ENCRYPTION_KEY": "k1:" + Data(SecureRandom.bytes(32)).base64EncodedString()
        ])
        var environment = harness.environment
        let newKey = "k2:" + Data(SecureRandom.bytes(32)).base64EncodedString()
        environment["TOKEN_ENCRYPTION_KEY"] = newKey + "," + harness.environment["TOKEN_ENCRYPTION_KEY"]!
        let run = try Self.run(["reencrypt"], environment: environment)
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.stdout.contains("oidc_signing_keys resealed=1 unreadable=0 remaining=0"), "\(run.stdout)")
        let store = SigningKeyStore(pool: harness.pool, tokenKeys: try TokenKeyRing(parsing: newKey))
        let token = try SigningKeys(store: store).sign(["sub": "x"])
        #expect(
            try JWSVerifier(allowedAlgorithms: [.rs256]).verify(
                token, keys: try JWKSet(json: try SigningKeys(store: store).jwks())
            ).keyID != nil)
    }
}
