import AppleID
import BrokerCore
import Console
import Deliveries
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
            timeout: appleSettings.timeout, metrics: metrics, logger: logger.labelled("apple"))
        self.apple = apple
        appleKeys = AppleKeyCache(
            refreshInterval: appleSettings.keysRefreshInterval, metrics: metrics, logger: logger.labelled("jwks"),
            fetch: { try apple.fetchKeys() })
        verifier = AppleTokenVerifier(keys: appleKeys)
        validator = IdentityTokenValidator(
            verifier: verifier, clientIDs: Set(appleSettings.clientIDs),
            leeway: Double(configuration.login.tokenLeeway.components.seconds),
            maximumAge: Double(configuration.login.tokenMaximumAge.components.seconds))
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
            interval: configuration.deletion.interval, logger: logger,
            step: DeletionJob(
                store: deletionStore, apple: apple, tokenKeys: tokenKeys, settings: configuration.deletion,
                groups: appleSettings.appGroups, validator: validator, metrics: metrics, logger: logger.labelled("deletion-job")
            ).step)
    }

    // MARK: Role `dispatch`

    func dispatcher() -> WorkerGroup {
        deliveryLane(
            WebhookLane(pool: pool, subscriptions: subscriptions), threadName: "dispatcher",
            lanes: configuration.dispatch.concurrency)
    }

    /// Back-Channel Logout deliveries of the OpenID Provider, when it is on: a lane of the
    /// same engine, woken by its channel's NOTIFY.
    func logoutDispatcher() -> (group: WorkerGroup, wakeChannel: String?)? {
        guard let oidc = configuration.oidc else { return nil }
        let lane = LogoutLane(
            store: LogoutDeliveryStore(pool: pool), keys: SigningKeys(store: SigningKeyStore(pool: pool, tokenKeys: tokenKeys)),
            issuer: oidc.issuer)
        let group = deliveryLane(lane, threadName: "oidc-logout", lanes: max(1, configuration.dispatch.concurrency / 2))
        return (group, lane.wakeChannel)
    }

    /// One lane of the delivery engine, as lanes of threads.
    private func deliveryLane(_ lane: some DeliveryLane, threadName: String, lanes: Int) -> WorkerGroup {
        let engine = DeliveryEngine(
            lane: lane, transport: transport, settings: configuration.dispatch.delivery, metrics: metrics,
            logger: logger.labelled(threadName))
        return WorkerGroup(
            name: threadName, lanes: lanes, interval: configuration.dispatch.interval, logger: logger, step: engine.step)
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
            interval: configuration.sweep.interval,
            logger: logger, step: sweep.step)
    }

    /// BrokerCore's pruning, then the console's tables' and, when the provider is on, the
    /// provider's (each module's own SQL, through BrokerCore's `ModulePruning` seam).
    func housekeeping() -> WorkerGroup {
        var modules: [any ModulePruning] = [ConsoleSessionStore(pool: pool)]
        if configuration.oidc != nil {
            modules.append(
                ProviderHousekeeping(
                    pool: pool, retention: configuration.dispatch.retention,
                    deadLetterRetention: configuration.dispatch.deadLetterRetention))
        }
        let housekeeping = Housekeeping(
            pool: pool, eventRetention: configuration.dispatch.retention,
            deadLetterRetention: configuration.dispatch.deadLetterRetention,
            notificationRetention: configuration.dispatch.notificationRetention,
            dormantUserRetention: configuration.deletion.dormantUserRetention, modules: modules)
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
            settings: configuration.login, validationInterval: configuration.sweep.validationInterval,
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
            leeway: configuration.login.tokenLeeway, retention: configuration.dispatch.notificationRetention, pool: pool,
            metrics: metrics,
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
