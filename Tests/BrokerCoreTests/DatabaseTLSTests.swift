import EmbeddedPostgres
import Foundation
import Glibc
import HTTPClient
import Observability
import PostgresClient
import ProcessRunner
import TestSupport
import Testing

/// Issue 29 item 8: `DATABASE_URL` with `sslmode=verify-full` and `sslrootcert` against a
/// PostgreSQL that serves TLS with a certificate from a throwaway CA.
@Suite("PostgreSQL over TLS", .offPool)
struct DatabaseTLSTests {
    /// A CA and a server certificate for 127.0.0.1 signed by it, and a second, unrelated CA.
    struct Certificates {
        let directory: String
        var ca: String { directory + "/ca.pem" }
        var otherCA: String { directory + "/other-ca.pem" }
        var serverCertificate: String { directory + "/server.pem" }
        var serverKey: String { directory + "/server.key" }

        init() throws {
            directory = "/tmp/abk-tls-\(UUID().uuidString.prefix(8))"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            try "subjectAltName=IP:127.0.0.1,DNS:localhost\n".write(
                toFile: directory + "/san.ext", atomically: true, encoding: .utf8)
            let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
            for (name, subject) in [("ca", "/CN=appleid-broker test CA"), ("other-ca", "/CN=someone else's CA")] {
                try Self.openssl(
                    ["req", "-x509"] + key + [
                        "-keyout", "\(directory)/\(name).key", "-out", "\(directory)/\(name).pem", "-days", "2", "-subj", subject,
                    ])
            }
            try Self.openssl(["req"] + key + ["-keyout", serverKey, "-out", directory + "/server.csr", "-subj", "/CN=127.0.0.1"])
            try Self.openssl([
                "x509", "-req", "-in", directory + "/server.csr", "-CA", ca, "-CAkey", directory + "/ca.key", "-CAcreateserial",
                "-out", serverCertificate, "-days", "2", "-extfile", directory + "/san.ext",
            ])
            // The server reads its key as its own account, and only from a private file.
            chmod(directory, 0o755)
            chmod(serverKey, 0o600)
            if geteuid() == 0, let account = getpwnam("postgres") {
                chown(serverKey, account.pointee.pw_uid, account.pointee.pw_gid)
            }
        }

        static func openssl(_ arguments: [String]) throws {
            let result = try ChildProcess.run("/usr/bin/openssl", arguments)
            guard result.status == 0 else { throw TLSFailure("openssl \(arguments[0]): \(result.output)") }
        }
    }

    struct TLSFailure: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    /// A cluster of its own listening on 127.0.0.1 with TLS on; returns it and its port.
    static func tlsCluster(_ certificates: Certificates) throws -> (EmbeddedPostgres, Int) {
        let port = FreePort.next()
        let directory = "/tmp/abk-tls-pg-\(UUID().uuidString.prefix(8))"
        var configuration = EmbeddedPostgres.Configuration(dataDirectory: directory + "/data")
        configuration.durable = false
        // TCP on 127.0.0.1 and a free port (the one port PostgreSQL has: its Unix socket
        // follows it, so this cluster is reached over TCP only).
        configuration.settings = [
            "listen_addresses": "127.0.0.1", "port": String(port), "ssl": "on",
            "ssl_cert_file": certificates.serverCertificate, "ssl_key_file": certificates.serverKey,
        ]
        let cluster = try EmbeddedPostgres(
            configuration: configuration, logger: Logger(label: "tls-pg", sink: LogSink(level: .error)))
        try cluster.start()
        return (cluster, port)
    }

    /// Runs `body` with a `DATABASE_URL` configuration (verify-full, trusting `authority`) for
    /// a TLS cluster of its own, then removes the cluster and the certificates.
    static func withTLSCluster(trusting authority: KeyPath<Certificates, String>, _ body: (PostgresConfiguration) throws -> Void)
        throws
    {
        let certificates = try Certificates()
        defer { try? FileManager.default.removeItem(atPath: certificates.directory) }
        let (cluster, port) = try Self.tlsCluster(certificates)
        defer {
            try? cluster.stop()
            try? FileManager.default.removeItem(
                atPath: (cluster.configuration.dataDirectory as NSString).deletingLastPathComponent)
        }
        try body(
            try PostgresConfiguration(
                connectionString: "postgres://broker@127.0.0.1:\(port)/postgres?sslmode=verify-full"
                    + "&sslrootcert=\(certificates[keyPath: authority])&connect_timeout=5"))
    }

    @Test("verify-full with the server's CA connects over TLS; the broker serves logins through it")
    func verifiedConnection() throws {
        try Self.withTLSCluster(trusting: \.ca) { configuration in
            let connection = try PostgresConnection(configuration: configuration)
            let ssl = try connection.query("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()").single()
            #expect(try ssl.decode(Bool.self, "ssl") == true)
            #expect(try ssl.decode(String.self, "version").hasPrefix("TLS"))

            let broker = try TestBroker(database: configuration, roles: TestBroker.allRoles)
            _ = try broker.signIn()
            #expect(try broker.count("SELECT count(*) FROM users") == 1)
        }
    }

    @Test("a server whose certificate another CA signed is refused, and the error says why")
    func wrongAuthority() throws {
        try Self.withTLSCluster(trusting: \.otherCA) { configuration in
            let error = #expect(throws: PostgresError.self) { try PostgresConnection(configuration: configuration) }
            #expect(error?.code == .connectionFailed)
            #expect(error.map { "\($0)" }?.contains("certificate verify failed") == true, "\(String(describing: error))")
        }
    }
}
