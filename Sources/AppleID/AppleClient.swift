import Foundation
import HTTPClient
import JOSE
import Observability
import StrictJSON
import Workers

/// Apple's token response (protocol reference §2).
public struct AppleTokenResponse: Sendable {
    public var accessToken: String
    /// Only on the authorization-code grant.
    public var refreshToken: String?
    public var idToken: String?
    public var expiresIn: Int?
}

/// Calls Apple's REST endpoints (`APPLE_BASE_URL` + `/auth/…`), form-encoded with
/// `client_secret_post`, blocking the calling thread. 5xx, 429 and transport failures are
/// retried per `RetryPolicy` (honouring `Retry-After`); Apple's 400 answers map to
/// `AppleAPIError`. Every call is counted by endpoint and status with its latency.
public final class AppleClient: Sendable {
    public let baseURL: String
    private let transport: any HTTPTransport
    private let secrets: ClientSecretProvider
    private let timeout: Duration
    private let logger: Logger
    private let calls: CounterFamily
    private let latency: HistogramFamily

    public init(
        baseURL: String, transport: any HTTPTransport, secrets: ClientSecretProvider, timeout: Duration = .seconds(5),
        metrics: MetricsRegistry, logger: Logger
    ) {
        self.baseURL = baseURL
        self.transport = transport
        self.secrets = secrets
        self.timeout = timeout
        self.logger = logger
        calls = metrics.counter(
            "apple_requests_total", help: "Calls to Apple by endpoint and HTTP status (0: no answer).",
            labels: ["endpoint", "status"])
        latency = metrics.histogram(
            "apple_request_duration_seconds", help: "Latency of calls to Apple by endpoint.", labels: ["endpoint"])
    }

    /// `GET /auth/keys`.
    public func fetchKeys(retry: RetryPolicy = RetryPolicy(maximumAttempts: 1)) throws -> JWKSet {
        let response = try send("keys", .init(url: baseURL + "/auth/keys", timeout: timeout), retry: retry)
        guard response.status == 200 else { throw Self.error(response) }
        do {
            return try JWKSet(json: response.body)
        } catch {
            throw AppleAPIError.malformedResponse("the JWK Set does not parse")
        }
    }

    /// The authorization-code grant. `redirectURI` only for codes from a web authorization
    /// request; native codes must be exchanged without one (protocol reference P9).
    ///
    /// A code is sent once, never retried: a call whose answer was lost (timeout, 5xx) may
    /// have consumed it, and the retry would only get `invalid_grant` "The code has already
    /// been used." (protocol reference §11.4). Such a failure is `unavailable`.
    public func exchangeCode(_ code: String, clientID: String, redirectURI: String? = nil) throws -> AppleTokenResponse {
        var fields = [
            ("client_id", clientID), ("client_secret", try secrets.secret(for: clientID)), ("code", code),
            ("grant_type", "authorization_code"),
        ]
        if let redirectURI { fields.append(("redirect_uri", redirectURI)) }
        return try tokenCall("token", fields, retry: RetryPolicy(maximumAttempts: 1))
    }

    /// The refresh-token grant: succeeds while the user still authorizes the app.
    public func refresh(_ refreshToken: String, clientID: String, retry: RetryPolicy = RetryPolicy()) throws -> AppleTokenResponse
    {
        try tokenCall(
            "token",
            [
                ("client_id", clientID), ("client_secret", try secrets.secret(for: clientID)),
                ("grant_type", "refresh_token"), ("refresh_token", refreshToken),
            ],
            retry: retry)
    }

    /// `POST /auth/revoke` with the client id the token was issued to. Apple answers 200 for
    /// revoked and already-invalid tokens alike.
    public func revoke(_ token: String, clientID: String, hint: String = "refresh_token", retry: RetryPolicy = RetryPolicy())
        throws
    {
        let response = try send(
            "revoke",
            .form(
                url: baseURL + "/auth/revoke",
                fields: [
                    ("client_id", clientID), ("client_secret", try secrets.secret(for: clientID)), ("token", token),
                    ("token_type_hint", hint),
                ], timeout: timeout),
            retry: retry)
        guard response.status == 200 else { throw Self.error(response) }
    }

    /// The `client_credentials` grant with scope `user.migration` (team transfer).
    public func migrationAccessToken(clientID: String, retry: RetryPolicy = RetryPolicy()) throws -> String {
        try tokenCall(
            "token",
            [
                ("client_id", clientID), ("client_secret", try secrets.secret(for: clientID)),
                ("grant_type", "client_credentials"), ("scope", "user.migration"),
            ],
            retry: retry
        ).accessToken
    }

    /// `POST /auth/usermigrationinfo`; returns the decoded JSON object.
    public func migrationInfo(
        _ fields: [(String, String)], accessToken: String, clientID: String, retry: RetryPolicy = RetryPolicy()
    ) throws -> [String: JSONValue] {
        let response = try send(
            "migration",
            .form(
                url: baseURL + "/auth/usermigrationinfo",
                fields: fields + [("client_id", clientID), ("client_secret", try secrets.secret(for: clientID))],
                headers: [("Authorization", "Bearer \(accessToken)")], timeout: timeout),
            retry: retry)
        guard response.status == 200 else { throw Self.error(response) }
        guard let object = try? JSONValue.parseObject(response.body) else {
            throw AppleAPIError.malformedResponse("usermigrationinfo answer is not a JSON object")
        }
        return object
    }

    // MARK: Internals

    private func tokenCall(_ endpoint: String, _ fields: [(String, String)], retry: RetryPolicy) throws -> AppleTokenResponse {
        let response = try send(endpoint, .form(url: baseURL + "/auth/token", fields: fields, timeout: timeout), retry: retry)
        guard response.status == 200 else { throw Self.error(response) }
        guard let object = try? JSONValue.parseObject(response.body), let accessToken = object["access_token"]?.stringValue else {
            throw AppleAPIError.malformedResponse("token answer lacks access_token")
        }
        return AppleTokenResponse(
            accessToken: accessToken, refreshToken: object["refresh_token"]?.stringValue,
            idToken: object["id_token"]?.stringValue, expiresIn: object["expires_in"]?.integerValue.map(Int.init))
    }

    /// Sends with retries on 5xx, 429 and transport failures; returns the last answer.
    private func send(_ endpoint: String, _ request: HTTPClientRequest, retry: RetryPolicy) throws -> HTTPClientResponse {
        var attempt = 0
        while true {
            attempt += 1
            let started = ContinuousClock.now
            do {
                let response = try transport.send(request)
                latency.observe((ContinuousClock.now - started).seconds, endpoint)
                calls.increment(endpoint, String(response.status))
                let retryable = response.status >= 500 || response.status == 429
                if !retryable { return response }
                let retryAfter = response.header("retry-after").flatMap(Self.retryAfterSeconds)
                // A wait longer than the policy allows is the caller's to honour (503 with
                // Retry-After, a rescheduled job), never shortened to fit a retry here.
                if attempt >= retry.maximumAttempts || (retryAfter.map { Duration.seconds($0) > retry.maximumDelay } ?? false) {
                    // "Apple answered 429 …" is how `isTooManyRequests` knows it.
                    throw AppleAPIError.unavailable(
                        "Apple answered \(response.status) to \(endpoint) \(attempt) times", retryAfter: retryAfter)
                }
                Thread.sleep(forTimeInterval: retry.delay(attempt: attempt, retryAfter: retryAfter).seconds)
            } catch let error as HTTPClientError {
                latency.observe((ContinuousClock.now - started).seconds, endpoint)
                calls.increment(endpoint, "0")
                if attempt >= retry.maximumAttempts {
                    throw AppleAPIError.unavailable("\(endpoint): \(error.code) after \(attempt) attempts")
                }
                logger.debug("retrying Apple call", [("endpoint", endpoint), ("error", "\(error.code)")])
                Thread.sleep(forTimeInterval: retry.delay(attempt: attempt, retryAfter: nil).seconds)
            }
        }
    }

    private static func error(_ response: HTTPClientResponse) -> AppleAPIError {
        let body = try? JSONValue.parseObject(response.body)
        let code = body?["error"]?.stringValue
        // Bounded: the description only feeds a verdict and a log line.
        let description = body?["error_description"]?.stringValue.map { String($0.prefix(200)) }
        switch code {
        case "invalid_grant": return .invalidGrant(description)
        case "invalid_client": return .invalidClient
        default: return .rejected(status: response.status, error: code, description: description)
        }
    }

    /// `Retry-After` as delay-seconds or an HTTP-date (RFC 9110 §10.2.3), at most a day.
    static func retryAfterSeconds(_ value: String) -> Int? {
        let trimmed = value.trimmingCharacters(in: .whitespaces)
        if let seconds = Int(trimmed) { return seconds >= 0 ? min(seconds, 86_400) : nil }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        guard let date = formatter.date(from: trimmed) else { return nil }
        return min(max(0, Int(date.timeIntervalSinceNow.rounded(.up))), 86_400)
    }
}
