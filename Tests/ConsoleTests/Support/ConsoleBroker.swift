import AppleSimulator
import BrokerAPI
import BrokerCore
import BrokerCrypto
import Console
import Foundation
import HTTPClient
import Observability
import PostgresClient
import TestSupport
import Testing

/// A broker with its console on a loopback port of its own, a fresh database and an Apple
/// simulator that knows the team's key; requests as a browser sends them, cookies by hand.
final class ConsoleBroker: Sendable {
    static let teamID = "TEAMID1234"
    static let clientID = "com.example.app"

    let application: BrokerApplication
    let simulator: AppleSimulator
    let environment: [String: String]
    let client = CurlTransport()
    /// The broker's log lines (its console's included), from `info` up.
    let logs = LogSink.capturing(level: .info)

    var console: ConsoleServer { application.console! }
    var consoleURL: String { "http://127.0.0.1:\(console.port)" }
    var apiURL: String { "http://127.0.0.1:\(application.port)" }
    var pool: PostgresPool { application.database.pool }

    init(
        roles: Set<BrokerConfiguration.Role> = [.api], extra: [String: String] = [:], oidc: ConsoleConfiguration.OIDC? = nil,
        configure: (inout ConsoleConfiguration) -> Void = { _ in }
    ) throws {
        simulator = try AppleSimulator(logger: Logger(label: "sim", sink: .capturing(level: .warning)))
        try simulator.start()
        var environment: [String: String] = [
            "DATABASE_URL": try TestPostgres.freshDatabase().connectionString,
            "BROKER_LISTEN": "127.0.0.1:0", "BROKER_LOG_LEVEL": "warning", "BROKER_HTTP_THREADS": "4",
            "APPLE_TEAM_ID": Self.teamID, "APPLE_KEY_ID": "KEYID12345",
            "APPLE_PRIVATE_KEY_PATH": try TestKeys.privateKeyFile(), "APPLE_CLIENT_IDS": Self.clientID,
            "APPLE_BASE_URL": simulator.baseURL,
            "TOKEN_ENCRYPTION_KEY": Data(SecureRandom.bytes(32)).base64EncodedString(),
            "BROKER_ROLES": roles.sorted().map(\.rawValue).joined(separator: ","),
        ]
        environment.merge(extra) { $1 }
        self.environment = environment
        let pem = try String(contentsOfFile: environment["APPLE_PRIVATE_KEY_PATH"]!, encoding: .utf8)
        simulator.registerTeam(
            teamID: Self.teamID, keyID: "KEYID12345", publicKey: try AppleSimulator.publicKey(fromPEM: pem),
            clientIDs: [Self.clientID])
        let configuration = try BrokerConfiguration.load(environment: environment, requireApple: true)
        var console = ConsoleConfiguration(listen: "127.0.0.1:0")
        console.oidc = oidc
        configure(&console)
        application = try BrokerApplication(
            configuration: configuration, console: console, logger: Logger(label: "broker", sink: logs))
        try application.start()
    }

    deinit {
        application.stop()
        simulator.stop()
    }

    // MARK: Browser requests

    /// - Parameter cookies: other cookies the browser holds (`name=value`), the OIDC binding's.
    func get(_ path: String, cookie: String? = nil, cookies: [String] = []) throws -> HTTPClientResponse {
        let all = (cookie.map { ["__Host-console=\($0)"] } ?? []) + cookies
        return try client.send(
            .init(url: consoleURL + path, headers: all.isEmpty ? [] : [("Cookie", all.joined(separator: "; "))]))
    }

    /// `name=value` of the cookie `name` a response sets (nil when it sets none or clears it).
    static func setCookie(_ name: String, _ response: HTTPClientResponse) -> String? {
        for (header, value) in response.headers where header.lowercased() == "set-cookie" {
            guard value.hasPrefix(name + "=") else { continue }
            let pair = String(value.prefix { $0 != ";" })
            return pair == name + "=" ? nil : pair
        }
        return nil
    }

    func post(_ path: String, form: [(String, String)], cookie: String? = nil, headers: [(String, String)] = [])
        throws -> HTTPClientResponse
    {
        let body = form.map { "\(Self.encode($0.0))=\(Self.encode($0.1))" }.joined(separator: "&")
        var all = [("Content-Type", "application/x-www-form-urlencoded")] + headers
        if let cookie { all.append(("Cookie", "__Host-console=\(cookie)")) }
        return try client.send(.init(method: "POST", url: consoleURL + path, headers: all, body: Array(body.utf8)))
    }

    static func encode(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._~"))) ?? ""
    }

    /// A sign-in link's token, as `appleid-broker console link` makes it.
    func link(_ role: ConsoleRole, operator name: String = "alice", ttl: Int = 900) throws -> String {
        try console.sessions.createLink(operatorID: name, role: role, ttlSeconds: ttl, actor: "test")
    }

    /// Signs in through a link; returns the session cookie's value.
    func signIn(_ role: ConsoleRole, operator name: String = "alice") throws -> String {
        let response = try post("/link", form: [("token", try link(role, operator: name))])
        #expect(response.status == 303)
        return try #require(Self.sessionCookie(response))
    }

    static func sessionCookie(_ response: HTTPClientResponse) -> String? {
        for (name, value) in response.headers where name.lowercased() == "set-cookie" {
            guard value.hasPrefix("__Host-console=") else { continue }
            let secret = value.dropFirst("__Host-console=".count).prefix { $0 != ";" }
            return secret.isEmpty ? nil : String(secret)
        }
        return nil
    }

    /// The value of the hidden `csrf_token` field of a page.
    static func csrfToken(_ response: HTTPClientResponse) -> String? {
        hidden("csrf_token", response)
    }

    static func hidden(_ name: String, _ response: HTTPClientResponse) -> String? {
        let html = response.bodyText
        guard let range = html.range(of: "name=\"\(name)\" value=\"") else { return nil }
        return String(html[range.upperBound...].prefix { $0 != "\"" })
    }

    // MARK: Users

    /// Signs a user in through the API with a code (so the broker holds a refresh token).
    func signInUser(email: String? = nil, withCode: Bool = true) throws -> (id: UUID, sub: String) {
        let key = try APIKeyStore(pool: pool).create(name: "test", scopes: [.login]).secret
        let minted = try simulator.mintToken(
            {
                var request = TokenRequest(clientID: Self.clientID)
                request.teamID = Self.teamID
                request.withCode = withCode
                if let email { request.email = email }
                return request
            }())
        var fields = ["identity_token": minted.idToken]
        if withCode { fields["authorization_code"] = minted.code! }
        let body = try JSONSerialization.data(withJSONObject: fields)
        let response = try client.send(
            .init(
                method: "POST", url: apiURL + "/v1/apple/login",
                headers: [("Content-Type", "application/json"), ("Authorization", "Bearer \(key)")], body: Array(body)))
        #expect(response.status == 200, "\(response.bodyText)")
        let json = try JSONSerialization.jsonObject(with: Data(response.body)) as! [String: Any]
        return (UUID(uuidString: json["user_id"] as! String)!, minted.sub)
    }

    func count(_ query: PostgresQuery) throws -> Int { try pool.query(query).single().decode(Int.self, 0) }
}
