import BrokerCrypto
import Foundation
import JOSE
import StrictJSON

/// A user of the simulated Apple ID service, as one team sees them.
public struct SimulatedUser: Sendable, Codable, Equatable {
    public var teamID: String
    /// Team-scoped identifier, `001234.<32 hex>.1234`.
    public var sub: String
    public var email: String?
    public var isPrivateEmail: Bool
    /// 0 unsupported, 1 unknown, 2 likely real.
    public var realUserStatus: Int
    /// A Managed Apple Account's organisation: its tokens carry `org_id` (protocol reference
    /// §11.7), its address is a real one.
    public var orgID: String? = nil

    enum CodingKeys: String, CodingKey {
        case teamID = "team_id"
        case sub, email
        case isPrivateEmail = "is_private_email"
        case realUserStatus = "real_user_status"
        case orgID = "org_id"
    }

    /// A fresh `sub` shaped like Apple's.
    static func makeSub() -> String {
        let digits = Int.random(in: 0..<10_000)
        let tail = Int.random(in: 0..<10_000)
        return "00" + String(format: "%04d", digits) + "." + Hex.encode(SecureRandom.bytes(16)) + "."
            + String(format: "%04d", tail)
    }

    /// Apple's relay domains: `privaterelay.appleid.com`, and `private.icloud.com` for
    /// addresses made from 2026-06-15 (protocol reference §11.7).
    public static let relayDomains = ["privaterelay.appleid.com", "private.icloud.com"]

    /// A fresh relay address on `domain`.
    static func makeRelayEmail(domain: String = relayDomains[0]) -> String {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz0123456789")
        return String((0..<10).map { _ in alphabet.randomElement()! }) + "@" + domain
    }
}

/// How to mint an identity token (every field optional, defaults as Apple would send).
public struct TokenRequest: Sendable, Codable {
    /// The user; created (in `teamID`) when absent or unknown.
    public var sub: String?
    public var teamID: String?
    /// `aud`: a bundle ID or Services ID.
    public var clientID: String
    /// The raw nonce; the token carries its lowercase hex SHA-256.
    public var rawNonce: String?
    /// A nonce put into the token as is (for mismatch tests).
    public var nonceClaim: String?
    public var nonceSupported: Bool?
    /// A real (non-relay) address for a new user; default is a relay address.
    public var email: String?
    /// Leave `email`, `email_verified`, `is_private_email` out.
    public var omitEmail: Bool?
    /// Send `email_verified`/`is_private_email` as "true"/"false" strings (pre-2024 style).
    public var booleansAsStrings: Bool?
    public var realUserStatus: Int?
    /// Seconds since 1970; default now.
    public var issuedAt: Int?
    /// `auth_time`, seconds since 1970: when the person last authenticated at Apple (default
    /// `iat`; earlier when Apple's own session let them through with a click).
    public var authTime: Int?
    /// Lifetime in seconds; default 600.
    public var lifetime: Int?
    public var transferSub: String?
    /// Also issue an authorization code for this user and client (returned with the token).
    public var withCode: Bool?
    /// The redirect URI the code is bound to (web flow); nil for native codes.
    public var redirectURI: String?
    /// A wrong `iss`, for negative tests (Apple always sends https://appleid.apple.com).
    public var issuer: String?
    /// Leave `real_user_status` out, as Apple does for web sign-ins.
    public var omitRealUserStatus: Bool?
    /// A Managed Apple Account (Work & School): the token carries `org_id` and the account's
    /// **real** address, no `is_private_email` (protocol reference §11.7).
    public var managedAccount: Bool?
    /// An Apple School Manager account: `org_id`, `email` empty, `email_verified` false
    /// (protocol reference §10.5, narrowed by §11.7).
    public var schoolAccount: Bool?
    /// The relay domain of a new user's address: `privaterelay.appleid.com` (default) or
    /// `private.icloud.com`.
    public var relayDomain: String?

    public init(clientID: String) { self.clientID = clientID }

    enum CodingKeys: String, CodingKey {
        case sub
        case teamID = "team_id"
        case clientID = "client_id"
        case rawNonce = "raw_nonce"
        case nonceClaim = "nonce_claim"
        case nonceSupported = "nonce_supported"
        case email
        case omitEmail = "omit_email"
        case booleansAsStrings = "booleans_as_strings"
        case realUserStatus = "real_user_status"
        case issuedAt = "iat"
        case authTime = "auth_time"
        case lifetime
        case transferSub = "transfer_sub"
        case withCode = "with_code"
        case redirectURI = "redirect_uri"
        case issuer = "iss"
        case omitRealUserStatus = "omit_real_user_status"
        case managedAccount = "managed_account"
        case schoolAccount = "school_account"
        case relayDomain = "relay_domain"
    }
}

/// What minting returns.
public struct MintedToken: Sendable, Codable {
    public var idToken: String
    public var sub: String
    public var email: String?
    /// Present when the request asked for a code.
    public var code: String?

    enum CodingKeys: String, CodingKey {
        case idToken = "id_token"
        case sub, email, code
    }
}

/// Faults injected into Apple's endpoints, for tests and benchmarks.
public struct FaultSettings: Sendable, Codable, Equatable {
    /// Added to every answer of the affected endpoints.
    public var latencyMilliseconds: Int = 0
    /// Share of answers replaced by an error status (0…1).
    public var errorRate: Double = 0
    /// Statuses drawn from for those errors (500, 503, 429).
    public var errorStatuses: [Int] = [500, 503, 429]
    /// `Retry-After` seconds sent with 429 and 503.
    public var retryAfterSeconds: Int = 1
    /// Send that `Retry-After` as an HTTP-date (RFC 9110 allows both forms).
    public var retryAfterAsDate: Bool = false
    /// Share of answers that stall for `timeoutMilliseconds` and then fail.
    public var timeoutRate: Double = 0
    public var timeoutMilliseconds: Int = 15_000
    /// Answer every refresh-token grant (and revoke-verification refresh) as a revoked grant.
    public var forceInvalidGrant: Bool = false
    /// How a refresh of a revoked grant is answered: `invalid_grant`, or `invalid_request`
    /// ("The user has revoked authorization for the client", as TN3107 lists it).
    public var revokedGrantError: String = "invalid_grant"
    /// Answer every token call with invalid_client (a wrong key, key id or team id).
    public var forceInvalidClient: Bool = false
    /// Serve `/auth/keys` as `{"keys":[]}`.
    public var emptyKeySet: Bool = false
    /// Which endpoints the faults hit: `token`, `revoke`, `keys`, `migration`, `authorize`. Empty: all.
    public var endpoints: [String] = []
    /// A stalled call did its work before its answer was lost, as Apple may: a code sent
    /// with it is used up (protocol reference §11.4). Default true, as Apple; false: the
    /// stall comes before the work.
    public var timeoutAfterWork: Bool = true
    /// Answer token and revoke calls as a malformed request: `invalid_request` without a
    /// revocation's wording (TN3107: a wrong content type, a missing parameter, a body a
    /// proxy rewrote), whatever the token; only on `endpoints` when they name any.
    public var malformedRequest: Bool = false
    /// The same, only for refreshes of these users' tokens (one token's request defect).
    public var malformedRequestSubs: [String] = []
    /// Every team transfer counts as this many days old. Apple bridges a transfer for 60 days
    /// (TN3159): past them `/auth/usermigrationinfo` refuses its transfer_sub
    /// (`invalid_request`) and the user's identity tokens stop carrying `transfer_sub`.
    public var transferAgeDays: Int = 0
    /// A user who stopped using Sign in with Apple for the app gets the `user` form field
    /// (name, e-mail) again on the next web authorization, a first authorization once more
    /// (Apple does; false: never again after the first).
    public var userFieldAfterRevocation: Bool = true
    /// The relay domain of new users' addresses when a request names none:
    /// `privaterelay.appleid.com` (nil) or `private.icloud.com` (protocol reference §11.7).
    public var relayDomain: String? = nil

    // MARK: Apple's clock (issue 35): notification delivery and intermittent request defects
    /// Apple's Server-to-Server Notification Endpoint for the simulated apps: where a user's
    /// revocation (`revoke-consent`) sends its `consent-revoked` (DTS, forum 708415: a user
    /// revoking in Settings does). nil: none is sent.
    public var notificationURL: String? = nil
    /// Every delivery leaves this long after its event; `event_time` stays the event's.
    public var notificationDelayMilliseconds: Int = 0
    /// How long Apple waits for the endpoint's answer: a delivery without a 2xx in that time is
    /// retried with the same `jti` (forums 830681, 811848), whether or not the endpoint applied it.
    public var notificationTimeoutMilliseconds: Int = 10_000
    /// Retries of a delivery that timed out or was not answered 2xx (Apple's schedule is
    /// unconfirmed, protocol reference §10.7).
    public var notificationRetries: Int = 3
    /// The wait before each retry, and before each duplicate.
    public var notificationRetryMilliseconds: Int = 1_000
    /// Each notification is delivered this many more times, each with a new `jti` ("duplicates
    /// may occur", forum 809509; §10.7).
    public var notificationDuplicates: Int = 0
    /// Share of `/auth/token` and `/auth/revoke` calls answered with an unworded
    /// `invalid_request`, whatever the token: an intermittent defect between the broker and
    /// Apple (one of two egress proxies rewriting bodies, a WAF rule; protocol reference §12.2).
    public var requestErrorRate: Double = 0
    /// Seed of the draws for `requestErrorRate`, restarted whenever the faults are set: the same
    /// seed fails the same calls.
    public var requestErrorSeed: Int = 1

    public init() {}

    /// Whether the faults that honour `endpoints` hit this one (all when none is named).
    func hits(_ endpoint: String) -> Bool { endpoints.isEmpty || endpoints.contains(endpoint) }

    enum CodingKeys: String, CodingKey, CaseIterable {
        case latencyMilliseconds = "latency_ms"
        case errorRate = "error_rate"
        case errorStatuses = "error_statuses"
        case retryAfterSeconds = "retry_after"
        case retryAfterAsDate = "retry_after_http_date"
        case timeoutRate = "timeout_rate"
        case timeoutMilliseconds = "timeout_ms"
        case forceInvalidGrant = "invalid_grant"
        case revokedGrantError = "revoked_grant_error"
        case forceInvalidClient = "invalid_client"
        case emptyKeySet = "empty_key_set"
        case endpoints
        case timeoutAfterWork = "timeout_after_work"
        case malformedRequest = "malformed_request"
        case malformedRequestSubs = "malformed_request_subs"
        case transferAgeDays = "transfer_age_days"
        case userFieldAfterRevocation = "user_field_after_revocation"
        case relayDomain = "relay_domain"
        case notificationURL = "notification_url"
        case notificationDelayMilliseconds = "notification_delay_ms"
        case notificationTimeoutMilliseconds = "notification_timeout_ms"
        case notificationRetries = "notification_retries"
        case notificationRetryMilliseconds = "notification_retry_ms"
        case notificationDuplicates = "notification_duplicates"
        case requestErrorRate = "request_error_rate"
        case requestErrorSeed = "request_error_seed"
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        latencyMilliseconds = try container.decodeIfPresent(Int.self, forKey: .latencyMilliseconds) ?? 0
        errorRate = try container.decodeIfPresent(Double.self, forKey: .errorRate) ?? 0
        errorStatuses = try container.decodeIfPresent([Int].self, forKey: .errorStatuses) ?? [500, 503, 429]
        retryAfterSeconds = try container.decodeIfPresent(Int.self, forKey: .retryAfterSeconds) ?? 1
        retryAfterAsDate = try container.decodeIfPresent(Bool.self, forKey: .retryAfterAsDate) ?? false
        timeoutRate = try container.decodeIfPresent(Double.self, forKey: .timeoutRate) ?? 0
        timeoutMilliseconds = try container.decodeIfPresent(Int.self, forKey: .timeoutMilliseconds) ?? 15_000
        forceInvalidGrant = try container.decodeIfPresent(Bool.self, forKey: .forceInvalidGrant) ?? false
        revokedGrantError = try container.decodeIfPresent(String.self, forKey: .revokedGrantError) ?? "invalid_grant"
        forceInvalidClient = try container.decodeIfPresent(Bool.self, forKey: .forceInvalidClient) ?? false
        emptyKeySet = try container.decodeIfPresent(Bool.self, forKey: .emptyKeySet) ?? false
        endpoints = try container.decodeIfPresent([String].self, forKey: .endpoints) ?? []
        timeoutAfterWork = try container.decodeIfPresent(Bool.self, forKey: .timeoutAfterWork) ?? true
        malformedRequest = try container.decodeIfPresent(Bool.self, forKey: .malformedRequest) ?? false
        malformedRequestSubs = try container.decodeIfPresent([String].self, forKey: .malformedRequestSubs) ?? []
        transferAgeDays = try container.decodeIfPresent(Int.self, forKey: .transferAgeDays) ?? 0
        userFieldAfterRevocation = try container.decodeIfPresent(Bool.self, forKey: .userFieldAfterRevocation) ?? true
        relayDomain = try container.decodeIfPresent(String.self, forKey: .relayDomain)
        notificationURL = try container.decodeIfPresent(String.self, forKey: .notificationURL)
        notificationDelayMilliseconds = try container.decodeIfPresent(Int.self, forKey: .notificationDelayMilliseconds) ?? 0
        notificationTimeoutMilliseconds =
            try container.decodeIfPresent(Int.self, forKey: .notificationTimeoutMilliseconds) ?? 10_000
        notificationRetries = try container.decodeIfPresent(Int.self, forKey: .notificationRetries) ?? 3
        notificationRetryMilliseconds = try container.decodeIfPresent(Int.self, forKey: .notificationRetryMilliseconds) ?? 1_000
        notificationDuplicates = try container.decodeIfPresent(Int.self, forKey: .notificationDuplicates) ?? 0
        requestErrorRate = try container.decodeIfPresent(Double.self, forKey: .requestErrorRate) ?? 0
        requestErrorSeed = try container.decodeIfPresent(Int.self, forKey: .requestErrorSeed) ?? 1
        for (value, key, range) in [
            (notificationDelayMilliseconds, CodingKeys.notificationDelayMilliseconds, 0...3_600_000),
            (notificationTimeoutMilliseconds, .notificationTimeoutMilliseconds, 1...600_000),
            (notificationRetries, .notificationRetries, 0...100),
            (notificationRetryMilliseconds, .notificationRetryMilliseconds, 0...3_600_000),
            (notificationDuplicates, .notificationDuplicates, 0...100),
        ] where !range.contains(value) {
            throw DecodingError.dataCorruptedError(forKey: key, in: container, debugDescription: "\(key.stringValue) is \(range)")
        }
        guard (0...1).contains(requestErrorRate) else {
            throw DecodingError.dataCorruptedError(forKey: .requestErrorRate, in: container, debugDescription: "a share, 0…1")
        }
        if let relayDomain, !SimulatedUser.relayDomains.contains(relayDomain) {
            throw DecodingError.dataCorruptedError(
                forKey: .relayDomain, in: container, debugDescription: "relay_domain is one of \(SimulatedUser.relayDomains)")
        }
    }
}

/// One call to `/auth/revoke`, as recorded for assertions.
public struct RevocationRecord: Sendable, Codable, Equatable {
    public var clientID: String
    public var tokenTypeHint: String?
    public var token: String
    /// `revoked`, `unknown_token`, `client_mismatch`, `already_revoked`, `fault`; `dead_token` (a
    /// password change killed it) and `other_team` (issued before its app moved to another team):
    /// 200 and nothing revoked, as Apple.
    public var outcome: String
    public var sub: String?

    enum CodingKeys: String, CodingKey {
        case clientID = "client_id"
        case tokenTypeHint = "token_type_hint"
        case token, outcome, sub
    }
}

/// Counts of calls per endpoint.
public struct EndpointStatistics: Sendable, Codable, Equatable {
    public var keys = 0
    public var token = 0
    public var revoke = 0
    public var migration = 0
    public var authorize = 0
}
