import BrokerAPI
import BrokerCore
import CommandArguments
import HTTPClient
import Workers

/// `appleid-broker healthcheck [--url URL]`: asks a running broker's `/readyz` and exits 0 on
/// 200, 1 otherwise. Container healthchecks call it directly (exec form): the runtime image's
/// `/bin/sh` is dash, which has no `/dev/tcp`, and the image ships no curl.
///
/// Reads only `BROKER_LISTEN` and `BROKER_TLS_CERT_PATH` from the environment, so it works in
/// the service's own container without its secrets.
enum HealthcheckCommand {
    static func run(_ arguments: ParsedArguments, environment: [String: String]) throws -> Int32 {
        let tlsCertificate = environment["BROKER_TLS_CERT_PATH"].flatMap { $0.isEmpty ? nil : $0 }
        let url: String
        if let given = arguments.options["url"] {
            guard given.hasPrefix("http://") || given.hasPrefix("https://") else {
                throw arguments.usageError("--url must be an http:// or https:// URL")
            }
            url = given
        } else {
            let listen = environment["BROKER_LISTEN"].flatMap { $0.isEmpty ? nil : $0 } ?? "127.0.0.1:8080"
            guard let authority = localAuthority(listen) else {
                throw arguments.usageError("BROKER_LISTEN: expected host:port, got '\(listen)'")
            }
            url = (tlsCertificate == nil ? "http://" : "https://") + authority + "/readyz"
        }
        // A broker serving TLS with its own certificate: trust that certificate for this one
        // call (a self-signed one verifies; a CA-issued one for another name needs --url).
        let transport = CurlTransport(maximumResponseBytes: 64 << 10, maximumIdleHandles: 0, caCertificatesPath: tlsCertificate)
        do {
            let response = try transport.send(HTTPClientRequest(url: url, timeout: .seconds(3)))
            guard response.status == 200 else {
                BrokerCommand.printError("unhealthy: \(url) answered \(response.status)")
                return 1
            }
            return 0
        } catch let error as HTTPClientError {
            BrokerCommand.printError("unhealthy: \(url): \(error.code)")
            return 1
        }
    }

    /// The address to reach a listener on from the same host: a wildcard listener
    /// (`0.0.0.0`, `[::]`, empty host) is asked on loopback.
    static func localAuthority(_ listen: String) -> String? {
        guard let colon = listen.lastIndex(of: ":") else { return nil }
        let host = String(listen[..<colon])
        let port = listen[listen.index(after: colon)...]
        guard let number = Int(port), (1...65535).contains(number) else { return nil }
        switch host {
        case "", "0.0.0.0", "*": return "127.0.0.1:\(number)"
        case "[::]": return "[::1]:\(number)"
        default: return "\(host):\(number)"
        }
    }
}
