import AppleSimulator
import BrokerCrypto
import Foundation
import HTTPClient
import HTTPServer
import JOSE
import Locking
import Observability
import StrictJSON
import Synchronization
import TestSupport
import Testing

/// The simulator over real HTTP on loopback, checked with the JOSE module.
@Suite("AppleSimulator")
final class AppleSimulatorTests {
    let simulator: AppleSimulator
    let client = CurlTransport()
    let teamKey: AsymmetricKey
    let keyFile: String
    static let teamID = "TEAMID1234"
    static let keyID = "KEYID12345"
    static let clientID = "com.example.app"

    init() throws {
        simulator = try AppleSimulator(logger: Logger(label: "sim", sink: .capturing()))
        try simulator.start()
        // A .p8 on disk, as Apple hands it out; the simulator learns its public half.
        teamKey = try AsymmetricKey.generateP256()
        keyFile = TestFiles.path("AuthKey", suffix: ".p8")
        try teamKey.privateKeyPEM().write(toFile: keyFile, atomically: true, encoding: .utf8)
        simulator.registerTeam(
            teamID: Self.teamID, keyID: Self.keyID, publicKey: try AppleSimulator.publicKey(fromPEM: teamKey.privateKeyPEM()),
            clientIDs: [Self.clientID, "com.example.web"])
    }

    deinit {
        simulator.stop()
        try? FileManager.default.removeItem(atPath: keyFile)
    }

    /// A client secret built with the JOSE module from the .p8 file, as the broker builds it.
    func clientSecret(
        clientID: String = clientID, issuedAt: Int? = nil, lifetime: Int = 300, key: AsymmetricKey? = nil,
        audience: String = "https://appleid.apple.com"
    ) throws -> String {
        let signingKey = try key ?? AsymmetricKey.privateKey(pem: String(contentsOfFile: keyFile, encoding: .utf8))
        let now = issuedAt ?? Int(Date().timeIntervalSince1970)
        return try JWSSigner(key: signingKey, keyID: Self.keyID).sign(claims: [
            "iss": .string(Self.teamID), "sub": .string(clientID), "aud": .string(audience),
            "iat": .integer(Int64(now)), "exp": .integer(Int64(now + lifetime)),
        ])
    }

    func post(_ path: String, form: [(String, String)], bearer: String? = nil) throws -> HTTPClientResponse {
        try client.send(
            .form(url: simulator.baseURL + path, fields: form, headers: bearer.map { [("Authorization", "Bearer \($0)")] } ?? []))
    }

    func keys() throws -> JWKSet {
        let response = try client.send(.init(url: simulator.baseURL + "/auth/keys"))
        #expect(response.status == 200)
        return try JWKSet(json: response.body)
    }

    @Test("a minted identity token verifies against /auth/keys over HTTP, and fails once rotation retires its key")
    func tokensAndRotation() throws {
        let minted = try simulator.mintToken(
            {
                var request = TokenRequest(clientID: Self.clientID)
                request.rawNonce = "raw-nonce-123"
                request.realUserStatus = 1
                return request
            }())
        let verified = try JWSVerifier().verify(minted.idToken, keys: try keys())
        #expect(verified.header.algorithm == "RS256")
        let claims = try verified.claims()
        #expect(claims["iss"] == "https://appleid.apple.com")
        #expect(claims["aud"] == .string(Self.clientID))
        #expect(claims["sub"] == .string(minted.sub))
        #expect(claims["nonce"] == .string(SHA256.hexHash("raw-nonce-123")))
        #expect(claims["email_verified"] == true)
        #expect(claims["is_private_email"] == true)
        #expect(claims["real_user_status"] == 1)
        #expect(minted.sub.split(separator: ".").count == 3)
        #expect(minted.email?.hasSuffix("@privaterelay.appleid.com") == true)

        let newKeyID = try simulator.rotateKeys()
        #expect(try keys().keys.count == 2)
        #expect(try JWSVerifier().verify(minted.idToken, keys: try keys()).keyID != newKeyID, "old key still published")
        simulator.retireOldKeys()
        let error = #expect(throws: JOSEError.self) { try JWSVerifier().verify(minted.idToken, keys: try self.keys()) }
        #expect(error?.code == .keyNotFound)
        let fresh = try simulator.mintToken(TokenRequest(clientID: Self.clientID))
        #expect(try JWSVerifier().verify(fresh.idToken, keys: try keys()).keyID == newKeyID)
    }

    @Test("booleans can be sent as strings; real addresses carry no is_private_email")
    func claimShapes() throws {
        var request = TokenRequest(clientID: Self.clientID)
        request.email = "jane@example.com"
        request.booleansAsStrings = true
        let claims = try JWSVerifier().verify(try simulator.mintToken(request).idToken, keys: try keys()).claims()
        #expect(claims["email_verified"] == "true")
        #expect(claims["is_private_email"] == nil)
        #expect(claims["email"] == "jane@example.com")
    }

    @Test("a client secret made by the JOSE module from a .p8 is accepted; the code grant returns tokens, once")
    func codeExchange() throws {
        var request = TokenRequest(clientID: Self.clientID)
        request.withCode = true
        let minted = try simulator.mintToken(request)
        let code = try #require(minted.code)
        let fields = [
            ("client_id", Self.clientID), ("client_secret", try clientSecret()), ("code", code),
            ("grant_type", "authorization_code"),
        ]
        let response = try post("/auth/token", form: fields)
        #expect(response.status == 200, "\(response.bodyText)")
        #expect(response.header("cache-control") == "no-store")
        let body = try JSONValue.parseObject(response.body)
        let refreshToken = try #require(body["refresh_token"]?.stringValue)
        #expect(body["token_type"] == "Bearer")
        #expect(body["expires_in"] == 3600)
        let idToken = try #require(body["id_token"]?.stringValue)
        #expect(try JWSVerifier().verify(idToken, keys: try keys()).claims()["sub"] == .string(minted.sub))

        let reused = try post("/auth/token", form: fields)
        #expect(reused.status == 400)
        #expect(try JSONValue.parseObject(reused.body)["error"] == "invalid_grant")

        // A refresh gives a new access token and id_token, and no new refresh token.
        let refreshed = try post(
            "/auth/token",
            form: [
                ("client_id", Self.clientID), ("client_secret", try clientSecret()), ("refresh_token", refreshToken),
                ("grant_type", "refresh_token"),
            ])
        #expect(refreshed.status == 200)
        let refreshedBody = try JSONValue.parseObject(refreshed.body)
        #expect(refreshedBody["refresh_token"] == nil)
        #expect(refreshedBody["access_token"] != nil)
    }

    @Test("benchmark batches: distinct users from first_user on, and codes /auth/token accepts once")
    func batches() throws {
        func batch(_ json: String) throws -> [String] {
            let response = try client.send(
                .init(
                    method: "POST", url: simulator.baseURL + "/sim/tokens/batch",
                    headers: [("Content-Type", "application/json")], body: Array(json.utf8)))
            #expect(response.status == 200, "\(response.bodyText)")
            return response.bodyText.split(separator: "\n").map(String.init)
        }
        let subs = try batch(#"{"count":5,"users":1,"first_user":70,"client_id":"com.example.app"}"#).map {
            try JWSVerifier().verify($0, keys: try keys()).claims()["sub"]?.stringValue
        }
        #expect(subs == (70..<75).map { "001234." + String(repeating: "0", count: 30) + String($0) + ".0042" })

        let lines = try batch(#"{"count":3,"users":1,"first_user":7,"with_code":true,"client_id":"com.example.app"}"#)
        #expect(lines.count == 3)
        for line in lines {
            let parts = line.split(separator: " ").map(String.init)
            let (token, code) = (parts[0], try #require(parts.count == 2 ? parts[1] : nil))
            let claims = try JWSVerifier().verify(token, keys: try keys()).claims()
            #expect(claims["c_hash"] == .string(Base64URL.encode(SHA256.hash(code).prefix(16))))
            let fields = [
                ("client_id", Self.clientID), ("client_secret", try clientSecret()), ("code", code),
                ("grant_type", "authorization_code"),
            ]
            let exchanged = try post("/auth/token", form: fields)
            #expect(exchanged.status == 200, "\(exchanged.bodyText)")
            let idToken = try #require(try JSONValue.parseObject(exchanged.body)["id_token"]?.stringValue)
            #expect(try JWSVerifier().verify(idToken, keys: try keys()).claims()["sub"] == claims["sub"])
            #expect(try post("/auth/token", form: fields).status == 400)
        }
    }

    @Test("what Apple rejects is rejected with Apple's error shapes")
    func rejections() throws {
        var request = TokenRequest(clientID: Self.clientID)
        request.withCode = true
        let code = try #require(try simulator.mintToken(request).code)
        func error(_ response: HTTPClientResponse) throws -> String? {
            #expect(response.status == 400)
            return try JSONValue.parseObject(response.body)["error"]?.stringValue
        }
        // A JSON body instead of a form.
        let json = try client.send(
            .init(
                method: "POST", url: simulator.baseURL + "/auth/token", headers: [("Content-Type", "application/json")],
                body: Array(#"{"client_id":"com.example.app","grant_type":"authorization_code"}"#.utf8)))
        #expect(try error(json) == "invalid_client")
        // Expired, too long-lived, signed by another key, wrong audience, sub ≠ client_id.
        let now = Int(Date().timeIntervalSince1970)
        for secret in [
            try clientSecret(issuedAt: now - 1000, lifetime: 600),
            try clientSecret(lifetime: 15_777_001),
            try clientSecret(key: try AsymmetricKey.generateP256()),
            try clientSecret(audience: "https://example.com"),
            try clientSecret(clientID: "com.example.web"),
            "not-a-jwt",
        ] {
            let response = try post(
                "/auth/token",
                form: [
                    ("client_id", Self.clientID), ("client_secret", secret), ("code", code), ("grant_type", "authorization_code"),
                ])
            #expect(try error(response) == "invalid_client")
        }
        // A native code with a redirect_uri, and a code for another client id.
        let withRedirect = try post(
            "/auth/token",
            form: [
                ("client_id", Self.clientID), ("client_secret", try clientSecret()), ("code", code),
                ("grant_type", "authorization_code"), ("redirect_uri", "https://example.com/callback"),
            ])
        #expect(try error(withRedirect) == "invalid_grant")
        let otherClient = try post(
            "/auth/token",
            form: [
                ("client_id", "com.example.web"), ("client_secret", try clientSecret(clientID: "com.example.web")),
                ("code", code), ("grant_type", "authorization_code"),
            ])
        #expect(try error(otherClient) == "invalid_grant")
        let unsupported = try post(
            "/auth/token",
            form: [
                ("client_id", Self.clientID), ("client_secret", try clientSecret()), ("grant_type", "password"),
            ])
        #expect(try error(unsupported) == "unsupported_grant_type")
    }

    @Test("revoke answers 200 for known and unknown tokens and records each call with its client id")
    func revoke() throws {
        var request = TokenRequest(clientID: Self.clientID)
        request.withCode = true
        let minted = try simulator.mintToken(request)
        let tokens = try JSONValue.parseObject(
            try post(
                "/auth/token",
                form: [
                    ("client_id", Self.clientID), ("client_secret", try clientSecret()), ("code", minted.code!),
                    ("grant_type", "authorization_code"),
                ]
            ).body)
        let refreshToken = tokens["refresh_token"]!.stringValue!
        simulator.clearRevocations()

        let wrongClient = try post(
            "/auth/revoke",
            form: [
                ("client_id", "com.example.web"), ("client_secret", try clientSecret(clientID: "com.example.web")),
                ("token", refreshToken), ("token_type_hint", "refresh_token"),
            ])
        #expect(wrongClient.status == 200 && wrongClient.body.isEmpty)
        #expect(simulator.isTokenValid(refreshToken), "a revoke with the wrong client id does nothing (P10)")

        let revoked = try post(
            "/auth/revoke",
            form: [
                ("client_id", Self.clientID), ("client_secret", try clientSecret()), ("token", refreshToken),
                ("token_type_hint", "refresh_token"),
            ])
        #expect(revoked.status == 200)
        #expect(!simulator.isTokenValid(refreshToken))
        let unknown = try post(
            "/auth/revoke",
            form: [
                ("client_id", Self.clientID), ("client_secret", try clientSecret()), ("token", "garbage"),
            ])
        #expect(unknown.status == 200)
        #expect(simulator.revocations.map(\.outcome) == ["client_mismatch", "revoked", "unknown_token"])
        #expect(simulator.revocations[1].clientID == Self.clientID)
        #expect(simulator.revocations[1].sub == minted.sub)

        let records = try JSONValue.parse(try client.send(.init(url: simulator.baseURL + "/sim/revocations")).body)
        #expect(records.arrayValue?.count == 3)
    }

    @Test("notifications are signed JWS with events as a JSON string and event_time in milliseconds")
    func notifications() throws {
        let received = Lock<[[UInt8]]>([])
        var router = Router()
        router.post("/hook") { request in
            received.withLock { $0.append(request.body) }
            return HTTPResponse(status: 200)
        }
        var configuration = HTTPServer.Configuration()
        configuration.listen = "127.0.0.1:0"
        configuration.accessLog = false
        let receiver = HTTPServer(
            configuration: configuration, router: router, logger: Logger(label: "r", sink: .capturing()),
            metrics: MetricsRegistry())
        try receiver.start()
        defer { receiver.shutdown() }

        var request = NotificationRequest(
            url: "http://127.0.0.1:\(receiver.port)/hook", type: "email-disabled", sub: "001234.abc.1234", clientID: Self.clientID
        )
        request.email = "x@privaterelay.appleid.com"
        request.isPrivateEmail = true
        let result = try simulator.sendNotification(request)
        #expect(result.status == 200)
        let body = try JSONValue.parseObject(try #require(received.withLock { $0.first }))
        let payload = try #require(body["payload"]?.stringValue)
        #expect(payload == result.payload)
        let claims = try JWSVerifier().verify(payload, keys: try keys()).claims()
        #expect(claims["iss"] == "https://appleid.apple.com")
        #expect(claims["jti"] == .string(result.jti))
        let eventsText = try #require(claims["events"]?.stringValue, "events is a JSON string")
        let events = try JSONValue.parseObject(Array(eventsText.utf8))
        #expect(events["type"] == "email-disabled")
        #expect(events["is_private_email"] == "true")
        #expect((events["event_time"]?.integerValue ?? 0) > 1_000_000_000_000, "milliseconds")
    }

    @Test("fault knobs: every answer can be an error with Retry-After, or slow")
    func faults() throws {
        var faults = FaultSettings()
        faults.errorRate = 1
        faults.errorStatuses = [429]
        faults.retryAfterSeconds = 7
        faults.endpoints = ["keys"]
        simulator.faults = faults
        let failing = try client.send(.init(url: simulator.baseURL + "/auth/keys"))
        #expect(failing.status == 429)
        #expect(failing.header("retry-after") == "7")

        faults = FaultSettings()
        faults.latencyMilliseconds = 300
        simulator.faults = faults
        let started = Date()
        #expect(try client.send(.init(url: simulator.baseURL + "/auth/keys")).status == 200)
        #expect(Date().timeIntervalSince(started) >= 0.3)

        simulator.faults = FaultSettings()
        #expect(simulator.statistics.keys >= 1)
    }

    @Test("team transfer: client_credentials, then usermigrationinfo on both sides")
    func migration() throws {
        let recipientKey = try AsymmetricKey.generateP256()
        simulator.registerTeam(
            teamID: "NEWTEAM001", keyID: "NEWKEY0001", publicKey: recipientKey, clientIDs: ["com.example.app.new"])
        let user = simulator.createUser(teamID: Self.teamID)

        func accessToken(_ clientID: String, _ secret: String) throws -> String {
            let response = try post(
                "/auth/token",
                form: [
                    ("client_id", clientID), ("client_secret", secret), ("grant_type", "client_credentials"),
                    ("scope", "user.migration"),
                ])
            #expect(response.status == 200)
            return try JSONValue.parseObject(response.body)["access_token"]!.stringValue!
        }
        let senderSecret = try clientSecret()
        let senderToken = try accessToken(Self.clientID, senderSecret)
        let exported = try post(
            "/auth/usermigrationinfo",
            form: [
                ("sub", user.sub), ("target", "NEWTEAM001"), ("client_id", Self.clientID), ("client_secret", senderSecret),
            ], bearer: senderToken)
        let transferSub = try #require(try JSONValue.parseObject(exported.body)["transfer_sub"]?.stringValue)

        let now = Int64(Date().timeIntervalSince1970)
        let recipientSecret = try JWSSigner(key: recipientKey, keyID: "NEWKEY0001").sign(claims: [
            "iss": "NEWTEAM001", "sub": "com.example.app.new", "aud": "https://appleid.apple.com",
            "iat": .integer(now), "exp": .integer(now + 300),
        ])
        let recipientToken = try accessToken("com.example.app.new", recipientSecret)
        let imported = try post(
            "/auth/usermigrationinfo",
            form: [
                ("transfer_sub", transferSub), ("client_id", "com.example.app.new"), ("client_secret", recipientSecret),
            ], bearer: recipientToken)
        let body = try JSONValue.parseObject(imported.body)
        let newSub = try #require(body["sub"]?.stringValue)
        #expect(newSub != user.sub)
        #expect(body["is_private_email"] == true)
        // Asking again gives the same new sub.
        let again = try post(
            "/auth/usermigrationinfo",
            form: [
                ("transfer_sub", transferSub), ("client_id", "com.example.app.new"), ("client_secret", recipientSecret),
            ], bearer: recipientToken)
        #expect(try JSONValue.parseObject(again.body)["sub"]?.stringValue == newSub)
        // Without the bearer token: invalid_client.
        let unauthorized = try post(
            "/auth/usermigrationinfo",
            form: [
                ("transfer_sub", transferSub), ("client_id", "com.example.app.new"), ("client_secret", recipientSecret),
            ])
        #expect(unauthorized.status == 400)
    }
}
