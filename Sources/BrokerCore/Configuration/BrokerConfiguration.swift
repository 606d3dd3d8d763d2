import BrokerCrypto
import Deliveries
import Foundation
import Observability
import Workers

/// Everything the service reads from its environment (12-factor), validated in one pass:
/// `load` reports every problem at once, each with the variable's name and what it expects.
public struct BrokerConfiguration: Sendable {
    /// `DATABASE_URL`; nil runs an embedded PostgreSQL in `dataDirectory/postgres`.
    public var databaseURL: String?
    /// `DATABASE_LISTEN_URL`: a direct connection (not through a transaction-pooling
    /// PgBouncer, which cannot keep a LISTEN) for notifications; nil uses `databaseURL`.
    public var databaseListenURL: String?
    /// `BROKER_LISTEN`, `host:port`.
    public var listen: String = "127.0.0.1:8080"
    /// `BROKER_METRICS_LISTEN`, `host:port`: serve `/metrics` there, and only there; nil
    /// serves it on `BROKER_LISTEN`.
    public var metricsListen: String?
    /// `BROKER_DATA_DIR`: local state (the embedded cluster).
    public var dataDirectory: String = "./.appleid-broker"
    /// `BROKER_HTTP_THREADS`: libmicrohttpd worker threads. A worker serves its connections
    /// one request at a time and blocks on PostgreSQL, so a request waits behind another
    /// connection's even while the cores have room; and the read pipeline batches only what
    /// is in flight at once. Interleaved A/B at 32 connections on 2 cores: 32 threads took
    /// 0.83–0.90 of 8 threads' CPU per repeat login (0.74 when every login writes), at
    /// 1.13–1.37× the throughput and a lower p99 (docs/benchmarks.md, 2026-12-04, sixth).
    public var httpThreads: Int = max(32, ProcessInfo.processInfo.activeProcessorCount * 16)
    /// `BROKER_MAX_BODY_BYTES`: request body limit.
    public var maximumBodyBytes: Int = 64 * 1024
    /// `BROKER_CONNECTION_TIMEOUT_SECONDS`: idle HTTP connections are closed after this.
    public var connectionTimeout: Duration = .seconds(30)
    /// `BROKER_MAX_CONNECTIONS_PER_IP`: simultaneous connections from one client address
    /// (0: no limit). Default 64 when the broker terminates TLS itself, off otherwise (behind a
    /// proxy every connection comes from the proxy).
    public var connectionsPerAddress: Int = 0
    /// `BROKER_TRUSTED_PROXIES`: comma-separated CIDRs of the proxies in front of the broker
    /// (default none). From such a peer the client is the right-most untrusted address of
    /// `X-Forwarded-For`; budgets and log lines use it. Checked when the server is built.
    public var trustedProxies: [String] = []
    /// `BROKER_HEADER_TIMEOUT_SECONDS`: a connection must send a request's headers and body
    /// this soon after it opens or its previous response went out (slow headers, trickled
    /// bodies), 0: off.
    public var headerTimeout: Duration = .seconds(10)
    /// `BROKER_SHUTDOWN_GRACE_SECONDS`: how long SIGTERM waits for in-flight requests.
    public var shutdownGrace: Duration = .seconds(10)
    /// `BROKER_DB_POOL_SIZE`.
    public var databasePoolSize: Int = 16
    /// `BROKER_DB_ACQUIRE_TIMEOUT_MS`: a request waiting longer for a connection gets 503.
    public var databaseAcquireTimeout: Duration = .milliseconds(2000)
    /// `BROKER_LOG_LEVEL`.
    public var logLevel: Logger.Level = .info
    /// `BROKER_ACCESS_LOG`: one log line per request.
    public var accessLog: Bool = true
    /// `BROKER_TLS_CERT_PATH` and `BROKER_TLS_KEY_PATH`: serve HTTPS directly (PEM files), for
    /// deployments without a terminating proxy; both unset serves plain HTTP.
    public var tls: (certificatePEM: String, keyPEM: String)?
    /// `BROKER_RATE_LIMIT_PER_KEY`: sustained requests per second per API key (0: off); bursts
    /// up to twice that.
    public var rateLimitPerKey: Double = 5000
    /// `BROKER_RATE_LIMIT_NOTIFICATIONS_PER_IP`: requests per second per client address on the
    /// public notification endpoint (0: off); bursts up to five times that.
    public var rateLimitNotificationsPerAddress: Double = 100
    /// `BROKER_RATE_LIMIT_AUTH_FAILURES_PER_IP`: failed API-key authentications per second per
    /// client address (0: off), bursts of thirty times that; beyond it 429, and unknown key
    /// ids are refused without a database query.
    public var rateLimitAuthFailuresPerAddress: Double = 1
    /// `BROKER_NOTIFICATIONS_PATH`: where Apple posts server-to-server notifications.
    public var notificationsPath: String = "/v1/apple/notifications"
    /// `BROKER_ROLES` (or `serve --roles`): which parts this process runs.
    public var roles: Set<Role> = Set(Role.allCases)
    /// Apple settings; nil for commands that do not talk to Apple.
    public var apple: AppleConfiguration?
    /// `TOKEN_ENCRYPTION_KEY`: keys that encrypt refresh tokens and webhook secrets.
    public var tokenKeys: TokenKeyRing?
    /// Login policy.
    public var login = LoginSettings()
    /// The refresh-token sweep.
    public var sweep = SweepSettings()
    /// The deletion job.
    public var deletion = DeletionSettings()
    /// Webhook delivery and event retention.
    public var dispatch = DispatchSettings()
    /// Web sign-in; nil unless `BROKER_PUBLIC_URL` and `APPLE_WEB_RETURN_URLS` are set.
    public var web: WebSignInSettings?
    /// The OpenID Provider (Sources/OpenIDProvider); nil unless `OIDC_ISSUER` is set. Read
    /// here so that every setting is checked in the one pass that reports all problems.
    public var oidc: OpenIDProviderSettings?

    /// The OpenID Provider's settings (`OIDC_*`; docs/configuration.md).
    public struct OpenIDProviderSettings: Sendable {
        /// `OIDC_ISSUER`: the provider's issuer; its endpoints live under the issuer's path.
        public var issuer: String
        /// `OIDC_APPLE_CLIENT_ID`: the Services ID users sign in with at Apple.
        public var appleClientID: String
        /// `BROKER_PUBLIC_URL`: Apple posts back to `<it>/v1/apple/web/callback`, the web sign-in's Return URL.
        public var publicURL: String
        /// `OIDC_KEY_PREPUBLISH_SECONDS`: a rotated-in key is published this long before it signs.
        public var keyPrepublish: Duration = .seconds(86_400)
        /// `OIDC_SESSION_SECONDS`: how long a sign-in at Apple keeps the person signed in at the
        /// provider in that browser (single sign-on, `prompt=none`); zero turns sessions off.
        public var sessionLifetime: Duration = .seconds(7 * 86_400)

        /// Where Apple posts the authorization: the web sign-in's callback.
        public var callbackURL: String { publicURL + "/v1/apple/web/callback" }

        public init(issuer: String, appleClientID: String, publicURL: String) {
            self.issuer = issuer
            self.appleClientID = appleClientID
            self.publicURL = publicURL
        }

        fileprivate static func load(_ reader: inout EnvironmentReader, clientIDs: [String]?) -> OpenIDProviderSettings? {
            let prepublish = reader.duration("OIDC_KEY_PREPUBLISH_SECONDS", in: 0...(30 * 86_400))
            let session = reader.duration("OIDC_SESSION_SECONDS", in: 0...(90 * 86_400))
            let appleClientID = reader.string("OIDC_APPLE_CLIENT_ID")
            guard var issuer = reader.string("OIDC_ISSUER") else {
                if appleClientID != nil || prepublish != nil || session != nil {
                    reader.problem(
                        "OIDC_ISSUER: missing; OIDC_APPLE_CLIENT_ID, OIDC_KEY_PREPUBLISH_SECONDS and OIDC_SESSION_SECONDS need it"
                    )
                }
                return nil
            }
            while issuer.hasSuffix("/") { issuer.removeLast() }
            // OpenID Connect Discovery §3: https, no query, no fragment (http on loopback for development).
            if !URLRule.accepts(issuer) || issuer.contains("?") {
                reader.problem("OIDC_ISSUER: expected an https URL without query (http only on loopback), got '\(issuer)'")
            }
            guard let appleClientID else {
                reader.problem(
                    "OIDC_APPLE_CLIENT_ID: missing; the Services ID (one of APPLE_CLIENT_IDS) the provider signs users in with")
                return nil
            }
            if let clientIDs, !clientIDs.contains(appleClientID) {
                reader.problem("OIDC_APPLE_CLIENT_ID: \(appleClientID) is not one of APPLE_CLIENT_IDS")
            }
            guard var publicURL = reader.string("BROKER_PUBLIC_URL") else {
                reader.problem("BROKER_PUBLIC_URL: missing; OIDC_ISSUER needs it (Apple posts back to its web callback)")
                return nil
            }
            while publicURL.hasSuffix("/") { publicURL.removeLast() }
            var settings = OpenIDProviderSettings(issuer: issuer, appleClientID: appleClientID, publicURL: publicURL)
            settings.keyPrepublish = prepublish ?? settings.keyPrepublish
            if let session { settings.sessionLifetime = session }
            return settings
        }
    }

    /// Sign in with Apple on the web through the broker (`BROKER_PUBLIC_URL`,
    /// `APPLE_WEB_RETURN_URLS`).
    public struct WebSignInSettings: Sendable {
        /// `BROKER_PUBLIC_URL`: the broker's address as browsers reach it. Apple posts back to
        /// `<it>/v1/apple/web/callback`, which must be a Return URL of each Services ID.
        public var publicURL: String
        /// `APPLE_WEB_RETURN_URLS`: per client id, the exact URLs a sign-in may end at
        /// (`com.example.web=https://app.example.com/done,https://…;com.other=…`). Nothing
        /// else is ever redirected to.
        public var returnURLs: [String: Set<String>]
        /// How long a sign-in may take on Apple's page.
        public var stateLifetime: Duration = .seconds(600)
        /// How long the app backend has to redeem a result code.
        public var resultLifetime: Duration = .seconds(120)

        /// Where Apple posts the authorization (the `redirect_uri`).
        public var callbackURL: String { publicURL + "/v1/apple/web/callback" }

        public init(publicURL: String, returnURLs: [String: Set<String>]) {
            self.publicURL = publicURL
            self.returnURLs = returnURLs
        }

        fileprivate static func load(_ reader: inout EnvironmentReader, clientIDs: [String]?) -> WebSignInSettings? {
            let publicURL = reader.string("BROKER_PUBLIC_URL")
            let returns = reader.string("APPLE_WEB_RETURN_URLS")
            guard publicURL != nil || returns != nil else { return nil }
            // The OpenID Provider alone needs only the public URL (its own settings check it).
            if returns == nil, reader.string("OIDC_ISSUER") != nil { return nil }
            guard var publicURL, let returns else {
                reader.problem("BROKER_PUBLIC_URL and APPLE_WEB_RETURN_URLS: web sign-in needs both (or neither)")
                return nil
            }
            while publicURL.hasSuffix("/") { publicURL.removeLast() }
            if !URLRule.accepts(publicURL) || publicURL.contains("?") {
                reader.problem(
                    "BROKER_PUBLIC_URL: expected an https URL without query (http only on loopback), got '\(publicURL)'")
            }
            let returnURLs = reader.urlsPerClientID("APPLE_WEB_RETURN_URLS", returns, clientIDs: clientIDs)
            return WebSignInSettings(publicURL: publicURL, returnURLs: returnURLs)
        }
    }

    /// Webhook delivery (`BROKER_DISPATCH_*`, `BROKER_WEBHOOK_*`) and outbox retention.
    public struct DispatchSettings: Sendable {
        /// `BROKER_DISPATCH_CONCURRENCY`: deliveries in flight at once per process.
        public var concurrency = 8
        /// `BROKER_DISPATCH_INTERVAL_MS`: how often idle dispatchers look for work (events
        /// written by this process wake them at once).
        public var interval: Duration = .milliseconds(1000)
        /// `BROKER_WEBHOOK_TIMEOUT_MS`: limit for one delivery.
        public var timeout: Duration = .milliseconds(5000)
        /// `BROKER_WEBHOOK_RETRY_BASE_MS`: first retry delay; doubles per attempt, with jitter.
        public var retryBase: Duration = .milliseconds(1000)
        /// `BROKER_WEBHOOK_RETRY_MAX_SECONDS`: longest retry delay.
        public var retryMaximum: Duration = .seconds(3600)
        /// `BROKER_WEBHOOK_MAX_AGE_SECONDS`: a delivery not made by then is `failed`.
        public var maximumAge: Duration = .seconds(86_400)
        /// `BROKER_EVENT_RETENTION_SECONDS`: delivered deliveries and events are pruned after this.
        public var retention: Duration = .seconds(7 * 86_400)
        /// `BROKER_WEBHOOK_MAX_SUBSCRIPTIONS`: subscriptions the broker holds at most (409
        /// `webhook_subscription_limit` beyond); it also bounds the delivery rows an event's
        /// transaction writes (see `broker_emit_event`).
        public var maximumSubscriptions = 50
        /// `BROKER_WEBHOOK_MAX_SUBSCRIPTIONS_PER_KEY`: subscriptions one API key may hold (409
        /// `webhook_subscription_limit` with `limit: per_key` beyond), so one key cannot fill
        /// the broker's ceiling for every other app's keys.
        public var maximumSubscriptionsPerKey = 10
        /// `BROKER_WEBHOOK_DEAD_LETTER_RETENTION_SECONDS`: failed deliveries, and deliveries
        /// parked by a paused subscription, are pruned once this old.
        public var deadLetterRetention: Duration = .seconds(30 * 86_400)
        /// `BROKER_WEBHOOK_DNS_TIMEOUT_MS`: limit for resolving a receiver's host name.
        public var dnsTimeout: Duration = .milliseconds(2000)
        /// `BROKER_WEBHOOK_LEASE_SECONDS`: a claimed delivery returns to the queue after this;
        /// must exceed the DNS and delivery timeouts, or a slow delivery is sent twice at once.
        public var lease: Duration = .seconds(60)
        /// `BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS`: webhook receivers may be on loopback and
        /// private networks (the demo, tests); off, only public addresses are reached.
        public var allowPrivateNetworks = false
        /// `BROKER_NOTIFICATION_RETENTION_SECONDS`: Apple's notifications stay in the inbox (for
        /// deduplication by `jti`) this long; older notifications are answered `stale`.
        public var notificationRetention: Duration = .seconds(30 * 86_400)

        /// What the delivery engine's lanes (webhooks, Back-Channel Logout) take from these:
        /// between attempts the base doubling up to the maximum, each between half and all of that.
        package var delivery: DeliverySettings {
            DeliverySettings(
                timeout: timeout, backoff: Backoff(first: retryBase, maximum: retryMaximum), maximumAge: maximumAge,
                lease: lease, dnsTimeout: dnsTimeout, allowPrivateNetworks: allowPrivateNetworks)
        }
    }

    public init() {}

    /// Identity-token checks and the risk hint (`APPLE_TOKEN_*`, `BROKER_CHALLENGE_*`).
    public struct LoginSettings: Sendable {
        /// `APPLE_TOKEN_LEEWAY_SECONDS`: clock skew allowed on `exp`, `iat`, `nbf`.
        public var tokenLeeway: Duration = .seconds(60)
        /// `APPLE_TOKEN_MAX_AGE_SECONDS`: identity tokens issued longer ago are refused (`token_too_old`).
        public var tokenMaximumAge: Duration = .seconds(600)
        /// `BROKER_CHALLENGE_UNKNOWN`: suggest a challenge when `real_user_status` is `unknown`.
        public var challengeUnknown = true
        /// `BROKER_CHALLENGE_UNSUPPORTED`: suggest a challenge when it is `unsupported` or absent.
        public var challengeUnsupported = false
        /// `BROKER_LAST_LOGIN_RESOLUTION_SECONDS`: a repeat login changing nothing rewrites
        /// `last_login_at` only when it is older than this, so busy users cost no write.
        public var lastLoginResolution: Duration = .seconds(60)
    }

    /// The account-deletion job (`BROKER_DELETION_*`).
    public struct DeletionSettings: Sendable {
        /// `BROKER_DELETION_CONCURRENCY`: deletion requests worked on in parallel per process.
        public var concurrency = 8
        /// `BROKER_DELETION_MAX_ATTEMPTS`: attempts before a request is dead-lettered (`failed`).
        public var maximumAttempts = 8
        /// `BROKER_DELETION_RETRY_BASE_MS`: first retry delay; it doubles per attempt (with jitter).
        public var retryBase: Duration = .milliseconds(5000)
        /// `BROKER_DELETION_RETRY_MAX_SECONDS`: longest retry delay.
        public var retryMaximum: Duration = .seconds(600)
        /// `BROKER_DELETION_LEASE_SECONDS`: a claimed request returns to the queue after this
        /// if its worker died.
        public var lease: Duration = .seconds(300)
        /// `BROKER_DELETION_INTERVAL_SECONDS`: how often the job polls besides being woken.
        public var interval: Duration = .seconds(5)
        /// `BROKER_DORMANT_USER_RETENTION_SECONDS`: a user whose every Apple token has been dead
        /// this long, with no sign-in since, is deleted (`DormantUsers`); nil (0) keeps them.
        public var dormantUserRetention: Duration? = .seconds(365 * 86_400)

        /// Between attempts: the base doubling up to the maximum, each between half and all of that.
        public var retryBackoff: Backoff {
            Backoff(first: retryBase, maximum: retryMaximum)
        }
    }

    /// The daily re-validation of stored refresh tokens (`BROKER_SWEEP_*`, `BROKER_REFRESH_VALIDATION_SECONDS`).
    public struct SweepSettings: Sendable {
        /// `BROKER_SWEEP_INTERVAL_SECONDS`: how often the sweep looks for due tokens.
        public var interval: Duration = .seconds(60)
        /// `BROKER_REFRESH_VALIDATION_SECONDS`: each token is validated at most this often
        /// (Apple asks for at most daily); up to a tenth more is added as jitter.
        public var validationInterval: Duration = .seconds(86_400)
        /// `BROKER_SWEEP_CONCURRENCY`: refresh calls to Apple in parallel.
        public var concurrency = 4
        /// `BROKER_SWEEP_BREAKER_SECONDS`: how long the sweep pauses when a run of tokens
        /// fails with one and the same non-verdict error (such as `invalid_client`).
        public var breakerPause: Duration = .seconds(900)
    }

    /// The parts of the service a process can run (`serve --roles`).
    public enum Role: String, Sendable, CaseIterable, Comparable {
        /// The HTTP API for app backends, compliance and operators.
        case api
        /// Apple's server-to-server notification endpoint.
        case notifications
        /// The account-deletion job.
        case deletion
        /// Webhook delivery to app backends.
        case dispatch
        /// The daily refresh-token check.
        case sweep

        public static func < (lhs: Role, rhs: Role) -> Bool { lhs.rawValue < rhs.rawValue }
    }

    /// Every problem found in the environment.
    public struct Invalid: Error, CustomStringConvertible, Sendable {
        public let problems: [String]

        public init(problems: [String]) { self.problems = problems }
        public var description: String {
            "invalid configuration:\n" + problems.map { "  - \($0)" }.joined(separator: "\n")
        }
    }

    /// Reads and validates the environment.
    /// - Parameter requireApple: true for `serve`, which cannot run without Apple credentials.
    public static func load(environment: [String: String], requireApple: Bool) throws -> BrokerConfiguration {
        var reader = EnvironmentReader(environment)
        var configuration = BrokerConfiguration()
        configuration.databaseURL = reader.string("DATABASE_URL")
        configuration.databaseListenURL = reader.string("DATABASE_LISTEN_URL")
        if configuration.databaseListenURL != nil && configuration.databaseURL == nil {
            reader.problem("DATABASE_LISTEN_URL: only with DATABASE_URL (the embedded PostgreSQL needs no other)")
        }
        configuration.listen = reader.string("BROKER_LISTEN") ?? configuration.listen
        if !configuration.listen.contains(":") {
            reader.problem("BROKER_LISTEN: expected host:port such as 127.0.0.1:8080, got '\(configuration.listen)'")
        }
        configuration.metricsListen = reader.string("BROKER_METRICS_LISTEN")
        if let metricsListen = configuration.metricsListen, !metricsListen.contains(":") || metricsListen == configuration.listen
        {
            reader.problem("BROKER_METRICS_LISTEN: expected host:port other than BROKER_LISTEN, got '\(metricsListen)'")
        }
        configuration.dataDirectory = reader.string("BROKER_DATA_DIR") ?? configuration.dataDirectory
        configuration.httpThreads = reader.integer("BROKER_HTTP_THREADS", in: 1...1024) ?? configuration.httpThreads
        configuration.maximumBodyBytes =
            reader.integer("BROKER_MAX_BODY_BYTES", in: 1024...(16 << 20)) ?? configuration.maximumBodyBytes
        configuration.connectionTimeout =
            reader.duration("BROKER_CONNECTION_TIMEOUT_SECONDS", in: 1...3600) ?? configuration.connectionTimeout
        configuration.shutdownGrace =
            reader.duration("BROKER_SHUTDOWN_GRACE_SECONDS", in: 0...600) ?? configuration.shutdownGrace
        configuration.databasePoolSize = reader.integer("BROKER_DB_POOL_SIZE", in: 1...500) ?? configuration.databasePoolSize
        configuration.databaseAcquireTimeout =
            reader.duration("BROKER_DB_ACQUIRE_TIMEOUT_MS", in: 10...60_000)
            ?? configuration.databaseAcquireTimeout
        if let level = reader.string("BROKER_LOG_LEVEL") {
            if let parsed = Logger.Level(name: level) {
                configuration.logLevel = parsed
            } else {
                reader.problem("BROKER_LOG_LEVEL: expected debug, info, notice, warning or error, got '\(level)'")
            }
        }
        configuration.accessLog = reader.boolean("BROKER_ACCESS_LOG") ?? configuration.accessLog
        switch (reader.string("BROKER_TLS_CERT_PATH"), reader.string("BROKER_TLS_KEY_PATH")) {
        case (nil, nil):
            break
        case (let certificate?, let key?):
            if let certificatePEM = try? String(contentsOfFile: certificate, encoding: .utf8),
                let keyPEM = try? String(contentsOfFile: key, encoding: .utf8),
                certificatePEM.contains("BEGIN CERTIFICATE"), keyPEM.contains("PRIVATE KEY")
            {
                configuration.tls = (certificatePEM, keyPEM)
            } else {
                reader.problem("BROKER_TLS_CERT_PATH / BROKER_TLS_KEY_PATH: cannot read a PEM certificate and private key")
            }
        default:
            reader.problem("BROKER_TLS_CERT_PATH and BROKER_TLS_KEY_PATH go together")
        }
        configuration.connectionsPerAddress =
            reader.integer("BROKER_MAX_CONNECTIONS_PER_IP", in: 0...65_536) ?? (configuration.tls == nil ? 0 : 64)
        if let proxies = reader.string("BROKER_TRUSTED_PROXIES") {
            configuration.trustedProxies = proxies.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter {
                !$0.isEmpty
            }
        }
        if let timeout = reader.duration("BROKER_HEADER_TIMEOUT_SECONDS", in: 0...3600) {
            configuration.headerTimeout = timeout
            if timeout > configuration.connectionTimeout {
                reader.problem(
                    "BROKER_HEADER_TIMEOUT_SECONDS: at most BROKER_CONNECTION_TIMEOUT_SECONDS (\(configuration.connectionTimeout.components.seconds))"
                )
            }
        } else {
            configuration.headerTimeout = min(configuration.headerTimeout, configuration.connectionTimeout)
        }
        configuration.rateLimitPerKey = Double(reader.integer("BROKER_RATE_LIMIT_PER_KEY", in: 0...1_000_000) ?? 5000)
        configuration.rateLimitAuthFailuresPerAddress =
            Double(reader.integer("BROKER_RATE_LIMIT_AUTH_FAILURES_PER_IP", in: 0...1_000_000) ?? 1)
        configuration.rateLimitNotificationsPerAddress =
            Double(reader.integer("BROKER_RATE_LIMIT_NOTIFICATIONS_PER_IP", in: 0...1_000_000) ?? 100)
        if let path = reader.string("BROKER_NOTIFICATIONS_PATH") {
            if path.hasPrefix("/") && !path.contains("{") && !path.contains("?") {
                configuration.notificationsPath = path
            } else {
                reader.problem(
                    "BROKER_NOTIFICATIONS_PATH: expected an absolute path such as /v1/apple/notifications, got '\(path)'")
            }
        }
        if let roles = reader.string("BROKER_ROLES") {
            configuration.roles = reader.roles(roles, variable: "BROKER_ROLES") ?? configuration.roles
        }
        configuration.apple = AppleConfiguration.load(&reader, required: requireApple)
        configuration.web = WebSignInSettings.load(&reader, clientIDs: configuration.apple?.clientIDs)
        configuration.oidc = OpenIDProviderSettings.load(&reader, clientIDs: configuration.apple?.clientIDs)
        var login = LoginSettings()
        login.tokenLeeway = reader.duration("APPLE_TOKEN_LEEWAY_SECONDS", in: 0...600) ?? login.tokenLeeway
        login.tokenMaximumAge =
            reader.duration("APPLE_TOKEN_MAX_AGE_SECONDS", in: 1...(10 * 365 * 86_400)) ?? login.tokenMaximumAge
        login.challengeUnknown = reader.boolean("BROKER_CHALLENGE_UNKNOWN") ?? login.challengeUnknown
        login.challengeUnsupported = reader.boolean("BROKER_CHALLENGE_UNSUPPORTED") ?? login.challengeUnsupported
        login.lastLoginResolution =
            reader.duration("BROKER_LAST_LOGIN_RESOLUTION_SECONDS", in: 0...86_400) ?? login.lastLoginResolution
        configuration.login = login
        var sweep = SweepSettings()
        sweep.interval = reader.duration("BROKER_SWEEP_INTERVAL_SECONDS", in: 1...86_400) ?? sweep.interval
        sweep.validationInterval =
            reader.duration("BROKER_REFRESH_VALIDATION_SECONDS", in: 1...(30 * 86_400)) ?? sweep.validationInterval
        sweep.concurrency = reader.integer("BROKER_SWEEP_CONCURRENCY", in: 1...64) ?? sweep.concurrency
        sweep.breakerPause =
            reader.duration("BROKER_SWEEP_BREAKER_SECONDS", in: 1...86_400) ?? sweep.breakerPause
        configuration.sweep = sweep
        var deletion = DeletionSettings()
        deletion.concurrency = reader.integer("BROKER_DELETION_CONCURRENCY", in: 1...256) ?? deletion.concurrency
        deletion.maximumAttempts = reader.integer("BROKER_DELETION_MAX_ATTEMPTS", in: 1...100) ?? deletion.maximumAttempts
        deletion.retryBase =
            reader.duration("BROKER_DELETION_RETRY_BASE_MS", in: 1...3_600_000) ?? deletion.retryBase
        deletion.retryMaximum =
            reader.duration("BROKER_DELETION_RETRY_MAX_SECONDS", in: 1...86_400) ?? deletion.retryMaximum
        deletion.lease = reader.duration("BROKER_DELETION_LEASE_SECONDS", in: 1...86_400) ?? deletion.lease
        deletion.interval = reader.duration("BROKER_DELETION_INTERVAL_SECONDS", in: 1...3600) ?? deletion.interval
        if let retention = reader.duration("BROKER_DORMANT_USER_RETENTION_SECONDS", in: 0...(3_650 * 86_400)) {
            if retention > .zero && retention < .seconds(86_400) {
                reader.problem(
                    "BROKER_DORMANT_USER_RETENTION_SECONDS: 0 (keep them) or at least 86400 (a day), got \(retention.components.seconds)"
                )
            } else {
                deletion.dormantUserRetention = retention == .zero ? nil : retention
            }
        }
        configuration.deletion = deletion
        var dispatch = DispatchSettings()
        dispatch.concurrency = reader.integer("BROKER_DISPATCH_CONCURRENCY", in: 1...256) ?? dispatch.concurrency
        dispatch.interval =
            reader.duration("BROKER_DISPATCH_INTERVAL_MS", in: 10...60_000) ?? dispatch.interval
        dispatch.timeout =
            reader.duration("BROKER_WEBHOOK_TIMEOUT_MS", in: 100...120_000) ?? dispatch.timeout
        dispatch.retryBase =
            reader.duration("BROKER_WEBHOOK_RETRY_BASE_MS", in: 1...3_600_000) ?? dispatch.retryBase
        dispatch.retryMaximum =
            reader.duration("BROKER_WEBHOOK_RETRY_MAX_SECONDS", in: 1...86_400) ?? dispatch.retryMaximum
        dispatch.maximumAge =
            reader.duration("BROKER_WEBHOOK_MAX_AGE_SECONDS", in: 1...(30 * 86_400)) ?? dispatch.maximumAge
        dispatch.retention =
            reader.duration("BROKER_EVENT_RETENTION_SECONDS", in: 60...(365 * 86_400)) ?? dispatch.retention
        dispatch.allowPrivateNetworks = reader.boolean("BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS") ?? false
        dispatch.maximumSubscriptions =
            reader.integer("BROKER_WEBHOOK_MAX_SUBSCRIPTIONS", in: 1...1000) ?? dispatch.maximumSubscriptions
        dispatch.maximumSubscriptionsPerKey =
            reader.integer("BROKER_WEBHOOK_MAX_SUBSCRIPTIONS_PER_KEY", in: 1...1000) ?? dispatch.maximumSubscriptionsPerKey
        dispatch.deadLetterRetention =
            reader.duration("BROKER_WEBHOOK_DEAD_LETTER_RETENTION_SECONDS", in: 3600...(365 * 86_400))
            ?? dispatch.deadLetterRetention
        dispatch.dnsTimeout =
            reader.duration("BROKER_WEBHOOK_DNS_TIMEOUT_MS", in: 100...30_000) ?? dispatch.dnsTimeout
        dispatch.lease = reader.duration("BROKER_WEBHOOK_LEASE_SECONDS", in: 1...3600) ?? dispatch.lease
        // A lease that can end while the delivery still runs lets another lane send it again.
        if dispatch.lease <= dispatch.timeout + dispatch.dnsTimeout + .seconds(5) {
            reader.problem(
                "BROKER_WEBHOOK_LEASE_SECONDS: \(dispatch.lease.components.seconds) s must exceed BROKER_WEBHOOK_TIMEOUT_MS + "
                    + "BROKER_WEBHOOK_DNS_TIMEOUT_MS + 5 s (\((dispatch.timeout + dispatch.dnsTimeout + .seconds(5)).wholeMilliseconds) ms)"
            )
        }
        dispatch.notificationRetention =
            reader.duration("BROKER_NOTIFICATION_RETENTION_SECONDS", in: 86_400...(3_650 * 86_400))
            ?? dispatch.notificationRetention
        configuration.dispatch = dispatch
        if let keys = reader.string("TOKEN_ENCRYPTION_KEY") {
            do {
                configuration.tokenKeys = try TokenKeyRing(parsing: keys)
            } catch {
                reader.problem("TOKEN_ENCRYPTION_KEY: \(error)")
            }
        } else if requireApple {
            reader.problem(
                "TOKEN_ENCRYPTION_KEY: missing; set it to 32 random bytes in base64 (openssl rand -base64 32), "
                    + "or id:base64,id:base64 to rotate (the first key encrypts)")
        }
        if !reader.problems.isEmpty { throw Invalid(problems: reader.problems) }
        return configuration
    }
}

/// Apple developer-account settings.
public struct AppleConfiguration: Sendable {
    /// `APPLE_TEAM_ID`: the 10-character Team ID (client-secret `iss`).
    public var teamID: String
    /// `APPLE_KEY_ID`: the 10-character Key ID of the Sign in with Apple key (client-secret `kid`).
    public var keyID: String
    /// `APPLE_PRIVATE_KEY_PATH`: the `.p8` file (PKCS#8 P-256), re-read when it changes.
    public var privateKeyPath: String
    /// `APPLE_CLIENT_IDS`: bundle IDs and Services IDs accepted as `aud`.
    public var clientIDs: [String]
    /// `APPLE_APP_GROUPS`: which client ids share one authorization at Apple (see `AppGroups`;
    /// required with more than one client id); as given to `init`, each client id its own group.
    public var appGroups: AppGroups
    /// `APPLE_BASE_URL`: where Apple's endpoints are (a simulator in tests). The expected
    /// issuer stays `https://appleid.apple.com` whatever this says.
    public var baseURL: String = "https://appleid.apple.com"
    /// `APPLE_REDIRECT_URIS`: per client id, the Return URLs registered at Apple that app
    /// backends may pass as a login's `redirect_uri` (codes from Sign in with Apple JS or an
    /// Android library are bound to it): `com.example.web=https://app.example.com/cb,…;…`.
    public var redirectURIs: [String: Set<String>] = [:]
    /// `APPLE_KEY_ID_PATH`: a file holding the key id, re-read when it changes (key rotation
    /// without a restart); nil uses `keyID`.
    public var keyIDPath: String?
    /// `APPLE_JWKS_REFRESH_SECONDS`: how often Apple's keys are re-fetched in the background.
    public var keysRefreshInterval: Duration = .seconds(900)
    /// `APPLE_TIMEOUT_MS`: limit for one call to Apple.
    public var timeout: Duration = .milliseconds(5000)
    /// `APPLE_MAX_ATTEMPTS`: tries for a call that meets 5xx, 429 or a timeout.
    public var maximumAttempts = 3

    public init(teamID: String, keyID: String, privateKeyPath: String, clientIDs: [String], baseURL: String) {
        self.teamID = teamID
        self.keyID = keyID
        self.privateKeyPath = privateKeyPath
        self.clientIDs = clientIDs
        self.appGroups = .separate(clientIDs)
        self.baseURL = baseURL
    }

    fileprivate static func load(_ reader: inout EnvironmentReader, required: Bool) -> AppleConfiguration? {
        let names = ["APPLE_TEAM_ID", "APPLE_KEY_ID", "APPLE_PRIVATE_KEY_PATH", "APPLE_CLIENT_IDS"]
        let anySet = names.contains { reader.string($0) != nil }
        guard required || anySet else { return nil }
        let teamID = reader.appleIdentifier("APPLE_TEAM_ID", what: "Team ID")
        let keyID = reader.appleIdentifier("APPLE_KEY_ID", what: "Key ID of the Sign in with Apple key")
        let path = reader.string("APPLE_PRIVATE_KEY_PATH")
        if path == nil {
            reader.problem("APPLE_PRIVATE_KEY_PATH: missing; the path of the .p8 key downloaded from developer.apple.com")
        } else if let path {
            do {
                let pem = try String(contentsOfFile: path, encoding: .utf8)
                let key = try AsymmetricKey.privateKey(pem: pem)
                if key.kind != .ecP256 { reader.problem("APPLE_PRIVATE_KEY_PATH: \(path) holds a \(key.kind) key, not P-256") }
            } catch let error as CryptoError {
                reader.problem("APPLE_PRIVATE_KEY_PATH: \(path) is not a PKCS#8 P-256 private key (\(error.code))")
            } catch {
                reader.problem("APPLE_PRIVATE_KEY_PATH: cannot read \(path)")
            }
        }
        let clientIDs = (reader.string("APPLE_CLIENT_IDS") ?? "")
            .split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        if clientIDs.isEmpty {
            reader.problem(
                "APPLE_CLIENT_IDS: missing; a comma-separated list of the bundle IDs and Services IDs to accept as audience")
        }
        var baseURL = reader.string("APPLE_BASE_URL") ?? "https://appleid.apple.com"
        while baseURL.hasSuffix("/") { baseURL.removeLast() }
        if !(baseURL.hasPrefix("https://") || baseURL.hasPrefix("http://")) {
            reader.problem("APPLE_BASE_URL: expected an http(s) URL, got '\(baseURL)'")
        }
        let keyIDPath = reader.string("APPLE_KEY_ID_PATH")
        if let keyIDPath, !FileManager.default.isReadableFile(atPath: keyIDPath) {
            reader.problem("APPLE_KEY_ID_PATH: cannot read \(keyIDPath)")
        }
        let refresh = reader.duration("APPLE_JWKS_REFRESH_SECONDS", in: 10...86_400)
        let timeout = reader.duration("APPLE_TIMEOUT_MS", in: 100...120_000)
        let attempts = reader.integer("APPLE_MAX_ATTEMPTS", in: 1...10)
        var appGroups = AppGroups.separate(clientIDs)
        switch AppGroups.parse(reader.string("APPLE_APP_GROUPS"), clientIDs: clientIDs) {
        case .success(let groups): appGroups = groups
        case .failure(let problems): problems.messages.forEach { reader.problem($0) }
        }
        let redirectURIs = reader.string("APPLE_REDIRECT_URIS").map {
            reader.urlsPerClientID("APPLE_REDIRECT_URIS", $0, clientIDs: clientIDs)
        }
        guard let teamID, let keyID, let path, !clientIDs.isEmpty else { return nil }
        var apple = AppleConfiguration(
            teamID: teamID, keyID: keyID, privateKeyPath: path, clientIDs: clientIDs, baseURL: baseURL)
        apple.appGroups = appGroups
        apple.redirectURIs = redirectURIs ?? [:]
        apple.keyIDPath = keyIDPath
        apple.keysRefreshInterval = refresh ?? apple.keysRefreshInterval
        apple.timeout = timeout ?? apple.timeout
        apple.maximumAttempts = attempts ?? apple.maximumAttempts
        return apple
    }
}

/// Reads variables and collects problems instead of stopping at the first one.
struct EnvironmentReader {
    let environment: [String: String]
    private(set) var problems: [String] = []

    /// The secrets that may also come from a file: `NAME_FILE` stands for `NAME` when `NAME`
    /// is unset (the Docker and Kubernetes secrets convention).
    static let fileBackedNames = ["DATABASE_URL", "DATABASE_LISTEN_URL", "TOKEN_ENCRYPTION_KEY"]

    init(_ environment: [String: String]) {
        var merged = environment
        var problems: [String] = []
        for base in Self.fileBackedNames {
            guard let path = environment[base + "_FILE"], !path.isEmpty, environment[base]?.isEmpty ?? true else { continue }
            if let contents = try? String(contentsOfFile: path, encoding: .utf8) {
                merged[base] = contents
            } else {
                problems.append("\(base)_FILE: cannot read \(path)")
            }
        }
        self.environment = merged
        self.problems = problems
    }

    mutating func problem(_ text: String) { problems.append(text) }

    /// The value, or nil when unset or blank.
    func string(_ name: String) -> String? {
        guard let value = environment[name]?.trimmingCharacters(in: .whitespacesAndNewlines), !value.isEmpty else {
            return nil
        }
        return value
    }

    mutating func integer(_ name: String, in range: ClosedRange<Int>) -> Int? {
        guard let text = string(name) else { return nil }
        guard let value = Int(text), range.contains(value) else {
            problem("\(name): expected a whole number from \(range.lowerBound) to \(range.upperBound), got '\(text)'")
            return nil
        }
        return value
    }

    /// A duration in the unit its variable's name says (`…_SECONDS`, `…_MS`), a whole number in `range`.
    mutating func duration(_ name: String, in range: ClosedRange<Int>) -> Duration? {
        guard let value = integer(name, in: range) else { return nil }
        if name.hasSuffix("_MS") { return .milliseconds(value) }
        precondition(name.hasSuffix("_SECONDS"), "\(name): a duration's variable names its unit")
        return .seconds(value)
    }

    mutating func boolean(_ name: String) -> Bool? {
        guard let text = string(name) else { return nil }
        switch text.lowercased() {
        case "1", "true", "yes", "on": return true
        case "0", "false", "no", "off": return false
        default:
            problem("\(name): expected true or false, got '\(text)'")
            return nil
        }
    }

    /// `clientID=url,url;clientID=url` (APPLE_WEB_RETURN_URLS, APPLE_REDIRECT_URIS): each URL
    /// https (plain http only on loopback) without user info or fragment, each client id one
    /// of `clientIDs` when those are known.
    mutating func urlsPerClientID(_ name: String, _ text: String, clientIDs: [String]?) -> [String: Set<String>] {
        var urls: [String: Set<String>] = [:]
        for entry in text.split(separator: ";").map({ $0.trimmingCharacters(in: .whitespaces) }) where !entry.isEmpty {
            let parts = entry.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            guard parts.count == 2, !parts[0].isEmpty else {
                problem("\(name): expected clientID=url[,url…] entries separated by ';', got '\(entry)'")
                continue
            }
            if let clientIDs, !clientIDs.contains(parts[0]) {
                problem("\(name): \(parts[0]) is not one of APPLE_CLIENT_IDS")
            }
            for url in parts[1].split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !url.isEmpty {
                if URLRule.accepts(url) {
                    urls[parts[0], default: []].insert(url)
                } else {
                    problem("\(name): '\(url)' is not an https URL without user info or fragment")
                }
            }
        }
        if urls.isEmpty { problem("\(name): no URL given") }
        return urls
    }

    mutating func roles(_ text: String, variable: String) -> Set<BrokerConfiguration.Role>? {
        var roles = Set<BrokerConfiguration.Role>()
        for part in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !part.isEmpty {
            guard let role = BrokerConfiguration.Role(rawValue: part) else {
                problem(
                    "\(variable): unknown role '\(part)'; roles are "
                        + BrokerConfiguration.Role.allCases.map(\.rawValue).joined(separator: ", "))
                return nil
            }
            roles.insert(role)
        }
        if roles.isEmpty {
            problem("\(variable): name at least one role")
            return nil
        }
        return roles
    }

    mutating func appleIdentifier(_ name: String, what: String) -> String? {
        guard let value = string(name) else {
            problem("\(name): missing; the 10-character \(what) from developer.apple.com")
            return nil
        }
        guard value.count == 10, value.allSatisfy({ $0.isASCII && ($0.isUppercase || $0.isNumber) }) else {
            problem("\(name): expected 10 uppercase letters and digits (the \(what)), got '\(value)'")
            return nil
        }
        return value
    }
}
