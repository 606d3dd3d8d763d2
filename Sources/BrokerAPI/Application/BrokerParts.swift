import AppleID
import BrokerCore
import Foundation
import HTTPClient
import HTTPServer
import Observability
import OpenIDProvider
import PostgresClient
import Workers

/// The components every role shares (Apple's client and keys, the token validator, the
/// stores), and one factory per role's workers and routes. `BrokerApplication` picks the
/// roles and wires what they return.
struct BrokerParts: Sendable {
    // What every part is made from.
    let configuration: BrokerConfiguration
    let appleSettings: AppleConfiguration
    /// Seals tokens, secrets and codes at rest; keys the subject hashes.
    let tokenKeys: TokenKeyRing
    /// How Apple and webhook receivers are reached (the seam tests replace).
    let transport: any HTTPTransport
    let pool: PostgresPool
    let metrics: MetricsRegistry
    let logger: Logger

    // Shared by several roles.
    let apiKeys: APIKeyAuthenticator
    /// Apple's `/auth/token`, `/auth/revoke` and `/auth/keys`.
    let apple: AppleClient
    /// Apple's signing keys, refreshed in the background, for logins and notifications alike.
    let appleKeys: AppleKeyCache
    let verifier: AppleTokenVerifier
    /// Identity tokens: a login's, and the one a deletion's code exchange returns.
    let validator: IdentityTokenValidator
    let retry: RetryPolicy
    /// Written by the deletion API, read by the deletion job.
    let deletionStore: DeletionStore
    /// Managed by the API, read by the dispatcher.
    let subscriptions: WebhookSubscriptionStore

    init(
        configuration: BrokerConfiguration, apple appleSettings: AppleConfiguration, tokenKeys: TokenKeyRing,
        pool: PostgresPool, metrics: MetricsRegistry, logger: Logger, transport: any HTTPTransport
    ) {
        self.configuration = configuration
        self.appleSettings = appleSettings
        self.tokenKeys = tokenKeys
        self.pool = pool
        self.metrics = metrics
        self.logger = logger
        self.transport = transport
        apiKeys = APIKeyAuthenticator(
            store: APIKeyStore(pool: pool),
            limiter: RateLimiter(rate: configuration.rateLimitPerKey, burst: configuration.rateLimitPerKey * 2),
            failures: RateLimiter(
                rate: configuration.rateLimitAuthFailuresPerAddress,
                burst: max(10, configuration.rateLimitAuthFailuresPerAddress * 30)),
            groups: appleSettings.appGroups)
        let secrets = ClientSecretProvider(
            teamID: appleSettings.teamID, keyID: appleSettings.keyID, keyPath: appleSettings.privateKeyPath,
            keyIDPath: appleSettings.keyIDPath, metrics: metrics, logger: logger.labelled("apple"))
        let apple = AppleClient(
            baseURL: appleSettings.baseURL, transport: transport, secrets: secrets,
            timeout: .milliseconds(appleSettings.timeoutMilliseconds), metrics: metrics, logger: logger.labelled("apple"))
        self.apple = apple
        appleKeys = AppleKeyCache(
            refreshInterval: .seconds(appleSettings.keysRefreshSeconds), metrics: metrics, logger: logger.labelled("jwks"),
            fetch: { try apple.fetchKeys() })
        verifier = AppleTokenVerifier(keys: appleKeys)
        validator = IdentityTokenValidator(
            verifier: verifier, clientIDs: Set(appleSettings.clientIDs),
            leeway: TimeInterval(configuration.login.tokenLeewaySeconds),
            maximumAge: TimeInterval(configuration.login.tokenMaximumAgeSeconds))
        retry = RetryPolicy(maximumAttempts: appleSettings.maximumAttempts)
        deletionStore = DeletionStore(pool: pool, teamID: appleSettings.teamID, hasher: SubjectHasher(keys: tokenKeys))
        var subscriptions = WebhookSubscriptionStore(pool: pool, tokenKeys: tokenKeys)
        subscriptions.allowPrivateNetworks = configuration.dispatch.allowPrivateNetworks
        subscriptions.maximumSubscriptions = configuration.dispatch.maximumSubscriptions
        subscriptions.maximumSubscriptionsPerKey = configuration.dispatch.maximumSubscriptionsPerKey
        self.subscriptions = subscriptions
    }

    // MARK: Role `deletion`

    func deletionWorker() -> WorkerGroup {
        WorkerGroup(
            name: "deletion-job", lanes: configuration.deletion.concurrency,
            interval: .seconds(configuration.deletion.intervalSeconds), logger: logger,
            step: DeletionJob(
                store: deletionStore, apple: apple, tokenKeys: tokenKeys, settings: configuration.deletion,
                groups: appleSettings.appGroups, validator: validator, metrics: metrics, logger: logger.labelled("deletion-job")
            ).step)
    }

    // MARK: Role `dispatch`

    func dispatcher() -> WorkerGroup {
        let dispatch = configuration.dispatch
        return WorkerGroup(
            name: "dispatcher", lanes: dispatch.concurrency, interval: .milliseconds(dispatch.intervalMilliseconds),
            logger: logger,
            step: WebhookDispatcher(
                pool: pool, subscriptions: subscriptions, transport: transport,
                settings: .init(
                    timeout: .milliseconds(dispatch.timeoutMilliseconds),
                    retryBase: .milliseconds(dispatch.retryBaseMilliseconds),
                    retryMaximum: .seconds(dispatch.retryMaximumSeconds), maximumAge: .seconds(dispatch.maximumAgeSeconds),
                    lease: .seconds(dispatch.leaseSeconds), dnsTimeout: .milliseconds(dispatch.dnsTimeoutMilliseconds)),
                metrics: metrics, logger: logger.labelled("dispatcher")
            ).step)
    }

    /// Back-Channel Logout deliveries of the OpenID Provider, when it is on.
    func logoutDispatcher() -> WorkerGroup? {
        guard let oidc = configuration.oidc else { return nil }
        let dispatch = configuration.dispatch
        let keys = SigningKeys(store: SigningKeyStore(pool: pool, tokenKeys: tokenKeys))
        return WorkerGroup(
            name: "oidc-logout", lanes: max(1, dispatch.concurrency / 2), interval: .milliseconds(dispatch.intervalMilliseconds),
            logger: logger,
            step: LogoutDispatcher(
                store: LogoutDeliveryStore(pool: pool), keys: keys, issuer: oidc.issuer, transport: transport, settings: dispatch,
                metrics: metrics, logger: logger.labelled("oidc-logout")
            ).step)
    }

    /// Brings parked deliveries of resumed subscriptions back, once a minute.
    func webhookReconciler() -> WorkerGroup {
        let pool = pool
        return WorkerGroup(name: "webhook-reconcile", lanes: 1, interval: .seconds(60), logger: logger) {
            try WebhookSubscriptionStore.reconcileParkedDeliveries(pool)
            return false
        }
    }

    // MARK: Role `sweep`

    func refreshSweep() -> WorkerGroup {
        let sweep = RefreshTokenSweep(
            pool: pool, apple: apple, tokenKeys: tokenKeys, settings: configuration.sweep, groups: appleSettings.appGroups,
            teamID: appleSettings.teamID, metrics: metrics, logger: logger.labelled("refresh-sweep"))
        return WorkerGroup(
            name: "refresh-sweep", lanes: configuration.sweep.concurrency,
            interval: .seconds(configuration.sweep.intervalSeconds),
            logger: logger, step: sweep.step)
    }

    /// The OpenID Provider's pruning, when it is on.
    func providerHousekeeping() -> WorkerGroup? {
        guard configuration.oidc != nil else { return nil }
        let housekeeping = ProviderHousekeeping(
            pool: pool, retentionSeconds: configuration.dispatch.retentionSeconds,
            deadLetterRetentionSeconds: configuration.dispatch.deadLetterRetentionSeconds)
        return WorkerGroup(name: "oidc-housekeeping", lanes: 1, interval: .seconds(300), logger: logger, step: housekeeping.step)
    }

    func housekeeping() -> WorkerGroup {
        let housekeeping = Housekeeping(
            pool: pool, eventRetentionSeconds: configuration.dispatch.retentionSeconds,
            deadLetterRetentionSeconds: configuration.dispatch.deadLetterRetentionSeconds,
            notificationRetentionSeconds: configuration.dispatch.notificationRetentionSeconds,
            dormantUserRetention: configuration.deletion.dormantUserRetention)
        return WorkerGroup(name: "housekeeping", lanes: 1, interval: .seconds(300), logger: logger, step: housekeeping.step)
    }

    // MARK: Role `api`

    /// - Returns: how the OpenID Provider answers the HTTP server's own refusals of requests for
    ///   its endpoints (nil without a provider, or for another path: a problem document).
    func registerAPI(
        on router: inout Router, wakeDeletions: @escaping @Sendable () -> Void, eventsWritten: @escaping @Sendable () -> Void
    ) throws -> (@Sendable (Problem, HTTPRequest) -> HTTPResponse?)? {
        let login = LoginService(
            validator: validator, apple: apple, pool: pool, tokenKeys: tokenKeys, teamID: appleSettings.teamID,
            settings: configuration.login, validationIntervalSeconds: configuration.sweep.validationIntervalSeconds,
            retry: retry, metrics: metrics, groups: appleSettings.appGroups, redirectURIs: appleSettings.redirectURIs,
            eventsWritten: eventsWritten)
        LoginRoutes.register(
            on: &router, login: login, users: UserDirectory(pool: pool, groups: appleSettings.appGroups), keys: apiKeys)
        EventRoutes.register(
            on: &router, subscriptions: subscriptions, feed: EventFeed(pool: pool), keys: apiKeys, wakeDispatcher: eventsWritten)
        DeletionRoutes.register(
            on: &router,
            service: DeletionService(
                store: deletionStore, wake: wakeDeletions,
                codes: .init(
                    tokenKeys: tokenKeys, clientIDs: Set(appleSettings.clientIDs), redirectURIs: appleSettings.redirectURIs,
                    webCallbackURL: configuration.web?.callbackURL),
                exchangeCode: {
                    [handedOver = HandedOverCode(store: deletionStore, apple: apple, tokenKeys: tokenKeys, validator: validator)]
                    in
                    try handedOver.exchange(deletionID: $0, userID: $1, inRequest: true)
                }),
            keys: apiKeys)
        // The OpenID Provider (OIDC_ISSUER): Apple's form posts for it come back to the web callback.
        var continuations: [any AppleFormPostContinuation] = []
        var refusals: (@Sendable (Problem, HTTPRequest) -> HTTPResponse?)?
        if let oidc = configuration.oidc {
            let provider = try OpenIDProvider(
                settings: oidc, appleBaseURL: appleSettings.baseURL, pool: pool, tokenKeys: tokenKeys, login: login,
                groups: appleSettings.appGroups, metrics: metrics,
                allowPrivateNetworks: configuration.dispatch.allowPrivateNetworks)
            let apiKeys = apiKeys
            provider.register(
                on: &router,
                authorizeAdmin: { request in
                    let key = try apiKeys.authenticate(request, requiring: .admin)
                    try apiKeys.limiter.check(key.id, what: "this API key")
                    return key
                }, perAddress: perAddressLimiter())
            continuations.append(provider.authorization)
            refusals = provider.refusal
        }
        WebSignInRoutes.register(
            on: &router,
            service: WebSignInService(
                settings: configuration.web, appleBaseURL: appleSettings.baseURL, store: WebSignInStore(pool: pool),
                login: login, keys: tokenKeys, metrics: metrics, continuations: continuations),
            keys: apiKeys, perAddress: perAddressLimiter())
        return refusals
    }

    // MARK: Role `notifications`

    func registerNotifications(
        on router: inout Router, wakeDeletions: @escaping @Sendable () -> Void, eventsWritten: @escaping @Sendable () -> Void
    ) {
        let receiver = NotificationReceiver(
            verifier: AppleTokenVerifier(keys: verifier.keys, source: .notification), clientIDs: Set(appleSettings.clientIDs),
            groups: appleSettings.appGroups,
            teamID: appleSettings.teamID, hasher: SubjectHasher(keys: tokenKeys),
            leeway: TimeInterval(configuration.login.tokenLeewaySeconds),
            retentionSeconds: configuration.dispatch.notificationRetentionSeconds, pool: pool, metrics: metrics,
            logger: logger.labelled("notifications"), onDeletionRequested: wakeDeletions, eventsWritten: eventsWritten)
        NotificationRoutes.register(
            on: &router, path: configuration.notificationsPath, receiver: receiver, perAddress: perAddressLimiter())
    }

    /// Requests per client address for the endpoints without an API key (browsers, Apple).
    private func perAddressLimiter() -> RateLimiter {
        RateLimiter(
            rate: configuration.rateLimitNotificationsPerAddress, burst: configuration.rateLimitNotificationsPerAddress * 5)
    }
}
