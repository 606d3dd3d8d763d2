import BrokerCrypto
import Foundation
import HTTPClient
import HTTPServer
import JOSE
import Locking
import Observability
import StrictJSON
import Synchronization

/// Plays `https://appleid.apple.com` on loopback, so development, the demo and every
/// test run without the internet: `/auth/keys`, `/auth/token`, `/auth/revoke`,
/// `/auth/usermigrationinfo`, identity tokens for test users, signed server-to-server
/// notifications, and fault knobs. It checks what Apple checks (client secrets, code
/// reuse, client ids) and answers with Apple's error shapes.
///
/// Use it in-process (`start(listen:)` and the Swift API) or as the `apple-sim` executable,
/// driven by its admin API under `/sim/`.
public final class AppleSimulator: Sendable {
    /// The issuer Apple puts in tokens, whatever URL the simulator listens on.
    public static let issuer = "https://appleid.apple.com"
    /// Lifetime of an authorization code (Apple: five minutes).
    static let codeLifetime: TimeInterval = 300
    /// Longest client-secret lifetime Apple accepts (about six months).
    static let maximumClientSecretLifetime = 15_777_000

    struct Team {
        var teamID: String
        var keys: [String: AsymmetricKey]
        var clientIDs: Set<String>
    }

    struct CodeGrant {
        var teamID: String
        var sub: String
        var clientID: String
        var redirectURI: String?
        var nonce: String?
        var expires: Date
        var used: Bool
    }

    struct Grant {
        var teamID: String
        var sub: String
        var clientID: String
        var revoked: Bool
        var kind: String  // refresh_token, access_token, migration
        /// Killed by a password change: refused with `invalid_grant` while the user's
        /// authorization stays (forum thread 651237).
        var dead = false
    }

    struct Transfer {
        var fromTeam: String
        var fromSub: String
        var toTeam: String
        var toSub: String?
        /// When the window starts: the app's move to `toTeam` (`transferApp`), or, for a
        /// transfer whose app never moved in the simulator, when the transfer_sub was made.
        var created = Date()
    }

    /// Apple bridges a team transfer for 60 days (TN3159).
    static let transferWindow: TimeInterval = 60 * 86_400

    /// Whether a transfer is still inside its window (`FaultSettings.transferAgeDays` ages them all).
    static func isOpen(_ transfer: Transfer, faults: FaultSettings) -> Bool {
        Date().timeIntervalSince(transfer.created) + TimeInterval(faults.transferAgeDays) * 86_400 <= transferWindow
    }

    /// Whether the user stopped using Sign in with Apple for `clientID`'s app group: tokens were
    /// issued to the group and every one is revoked. Their next authorization is a first one.
    public func consentRevoked(teamID: String, sub: String, clientID: String) -> Bool {
        state.withLock { state in
            let primary = state.primaryAppIDs[clientID] ?? clientID
            let grants = state.grants.values.filter {
                $0.teamID == teamID && $0.sub == sub && $0.kind != "migration"
                    && (state.primaryAppIDs[$0.clientID] ?? $0.clientID) == primary
            }
            return !grants.isEmpty && grants.allSatisfy(\.revoked)
        }
    }

    struct State {
        var teams: [String: Team] = [:]
        var signingKeys: [(keyID: String, key: AsymmetricKey)] = []
        var users: [String: SimulatedUser] = [:]  // "team|sub"
        var codes: [String: CodeGrant] = [:]
        var grants: [String: Grant] = [:]  // token → grant
        var transfers: [String: Transfer] = [:]  // transfer_sub → transfer
        var revocations: [RevocationRecord] = []
        var statistics = EndpointStatistics()
        var faults = FaultSettings()
        /// Client id → its group's primary App ID (`setAppGroups`); an id in no group is its own.
        var primaryAppIDs: [String: String] = [:]
        /// Services ID → its registered Return URLs (`registerReturnURLs`).
        var returnURLs: [String: Set<String>] = [:]
        /// "from|to" → when apps moved from one team to the other (`transferApp`).
        var appTransfers: [String: Date] = [:]
    }

    let state: Lock<State>
    /// Seeded fault draws and Apple's own notification deliveries (NotificationDelivery.swift).
    let appleClock = Lock(AppleClockState())
    let logger: Logger
    let transport: any HTTPTransport
    private let server = Lock<HTTPServer?>(nil)
    /// The team used when a request names none and several are registered.
    public let defaultTeamID: String

    /// A simulator with one RSA signing key and a default team `SIMTEAM001`.
    public init(defaultTeamID: String = "SIMTEAM001", logger: Logger = Logger(label: "apple-sim")) throws {
        self.defaultTeamID = defaultTeamID
        self.logger = logger
        self.transport = CurlTransport()
        var initial = State()
        initial.signingKeys = [(Self.makeKeyID(), try AsymmetricKey.generateRSA())]
        initial.teams[defaultTeamID] = Team(teamID: defaultTeamID, keys: [:], clientIDs: [])
        state = Lock(initial)
    }

    // MARK: Teams and keys

    /// Registers a team's Sign in with Apple key (the public half of its `.p8`) and its
    /// client ids, so client secrets signed with that key are accepted.
    public func registerTeam(teamID: String, keyID: String, publicKey: AsymmetricKey, clientIDs: [String]) {
        state.withLock { state in
            var team = state.teams[teamID] ?? Team(teamID: teamID, keys: [:], clientIDs: [])
            team.keys[keyID] = publicKey
            team.clientIDs.formUnion(clientIDs)
            state.teams[teamID] = team
        }
    }

    /// Groups client ids under primary App IDs, as Apple does (each array: the primary first).
    /// Grouped apps share one authorization: a notification's `aud` is the group's primary,
    /// revoking one token ends the group's authorization, and consent is revoked per group.
    public func setAppGroups(_ groups: [[String]]) {
        state.withLock { state in
            state.primaryAppIDs = [:]
            for group in groups where !group.isEmpty {
                for clientID in group { state.primaryAppIDs[clientID] = group[0] }
            }
        }
    }

    /// An app transfer completes (TN3159): `clientIDs` (the primary App ID and what is grouped
    /// under it: Services IDs move with their primary App ID) leave `from` for `to`. From now on
    /// `from`'s client secrets for them are refused (`invalid_client`), so its tokens issued
    /// before can neither be refreshed nor revoked by the sender, and the recipient's revoke of
    /// them answers 200 and ends nothing; the 60-day transfer window starts now.
    public func transferApp(clientIDs: [String], from: String, to: String) {
        state.withLock { state in
            state.teams[from]?.clientIDs.subtract(clientIDs)
            var recipient = state.teams[to] ?? Team(teamID: to, keys: [:], clientIDs: [])
            recipient.clientIDs.formUnion(clientIDs)
            state.teams[to] = recipient
            let now = Date()
            state.appTransfers[from + "|" + to] = now
            for (transferSub, transfer) in state.transfers where transfer.fromTeam == from && transfer.toTeam == to {
                state.transfers[transferSub]?.created = now
            }
        }
    }

    /// Registers Return URLs for a Services ID, as the developer account does: the web flow's
    /// `redirect_uri` must be one of them.
    public func registerReturnURLs(clientID: String, urls: [String]) {
        state.withLock { $0.returnURLs[clientID, default: []].formUnion(urls) }
    }

    /// Whether `url` is a Return URL registered for `clientID`.
    func isRegisteredReturnURL(_ url: String, clientID: String) -> Bool {
        state.withLock { $0.returnURLs[clientID]?.contains(url) ?? false }
    }

    /// The primary App ID of a client id's group.
    public func primaryAppID(of clientID: String) -> String {
        state.withLock { $0.primaryAppIDs[clientID] ?? clientID }
    }

    /// The public JWK Set served at `/auth/keys`.
    public var keySet: JWKSet {
        state.withLock { JWKSet(keys: $0.signingKeys.map { JWK(key: $0.key, keyID: $0.keyID) }) }
    }

    /// The id of the key that signs new tokens.
    public var currentKeyID: String { state.withLock { $0.signingKeys.last!.keyID } }

    /// Adds a new signing key (new tokens use it); old keys stay published until `retireOldKeys`.
    @discardableResult
    public func rotateKeys() throws -> String {
        let key = try AsymmetricKey.generateRSA()
        let keyID = Self.makeKeyID()
        state.withLock { $0.signingKeys.append((keyID, key)) }
        return keyID
    }

    /// Stops publishing every key but the newest; tokens signed by them no longer verify.
    @discardableResult
    public func retireOldKeys() -> [String] {
        state.withLock { state in
            let retired = state.signingKeys.dropLast().map(\.keyID)
            state.signingKeys = [state.signingKeys.last!]
            return retired
        }
    }

    // MARK: Users and tokens

    /// Creates a user in `teamID` (default team when nil) with a relay address unless `email` is given.
    @discardableResult
    public func createUser(
        teamID: String? = nil, email: String? = nil, realUserStatus: Int = 2, relayDomain: String? = nil, orgID: String? = nil
    ) -> SimulatedUser {
        let domain = relayDomain ?? faults.relayDomain ?? SimulatedUser.relayDomains[0]
        let user = SimulatedUser(
            teamID: teamID ?? defaultTeamID, sub: SimulatedUser.makeSub(),
            email: email ?? SimulatedUser.makeRelayEmail(domain: domain),
            isPrivateEmail: email == nil, realUserStatus: realUserStatus, orgID: orgID)
        state.withLock { $0.users[user.teamID + "|" + user.sub] = user }
        return user
    }

    /// The organisation managing an account changes, or releases it (nil): the user's next
    /// tokens carry that `org_id`, or none (issue 35).
    public func setOrganization(teamID: String? = nil, sub: String, orgID: String?) {
        state.withLock { $0.users[(teamID ?? defaultTeamID) + "|" + sub]?.orgID = orgID }
    }

    /// A user by team and sub.
    public func user(teamID: String? = nil, sub: String) -> SimulatedUser? {
        state.withLock { $0.users[(teamID ?? defaultTeamID) + "|" + sub] }
    }

    /// Mints an identity token as Apple would, creating the user when needed.
    public func mintToken(_ request: TokenRequest) throws -> MintedToken {
        let teamID = request.teamID ?? teamFor(clientID: request.clientID)
        var user: SimulatedUser
        if let sub = request.sub, let existing = self.user(teamID: teamID, sub: sub) {
            user = existing
        } else {
            // A managed account's address is the organisation's, never a relay.
            let email = request.email ?? (request.managedAccount == true ? "m\(Int.random(in: 0..<1_000_000))@org.example" : nil)
            user = createUser(
                teamID: teamID, email: email, realUserStatus: request.realUserStatus ?? 2, relayDomain: request.relayDomain,
                orgID: request.managedAccount == true || request.schoolAccount == true
                    ? "org.\(Hex.encode(SecureRandom.bytes(4)))" : nil)
            if let sub = request.sub {
                // Keep the caller's sub (tests address users by it).
                state.withLock { state in
                    state.users.removeValue(forKey: teamID + "|" + user.sub)
                    user.sub = sub
                    state.users[teamID + "|" + sub] = user
                }
            }
        }
        var code: String?
        if request.withCode == true {
            code = issueCode(
                teamID: teamID, sub: user.sub, clientID: request.clientID, redirectURI: request.redirectURI,
                nonce: request.rawNonce.map(SHA256.hexHash))
        }
        let token = try identityToken(
            for: user, clientID: request.clientID, request: request, code: code, accessToken: nil)
        return MintedToken(idToken: token, sub: user.sub, email: request.omitEmail == true ? nil : user.email, code: code)
    }

    /// Many identity tokens for benchmarks: subs `001234.<32 digits of the index>.0042`
    /// drawn at random from `users` (relay e-mail, likely real), or `first_user` onwards one
    /// each; signed on all cores. With `with_code`, each line is the token and a code issued
    /// with it (the users are created here, as `/auth/token` needs them).
    func mintBatch(_ batch: AdminEndpoints.BatchRequest) throws -> [String] {
        let (keyID, key) = state.withLock { $0.signingKeys.last! }
        let signer = try JWSSigner(key: key, keyID: keyID)
        let now = Int64(Date().timeIntervalSince1970)
        let tokens = Lock<[String?]>(Array(repeating: nil, count: batch.count))
        let failures = Lock<Int>(0)
        DispatchQueue.concurrentPerform(iterations: batch.count) { index in
            let number = batch.firstUser.map { $0 + index } ?? Int.random(in: 0..<batch.users)
            let sub = "001234." + String(repeating: "0", count: max(0, 32 - String(number).count)) + String(number) + ".0042"
            if batch.withCode == true {
                var request = TokenRequest(clientID: batch.clientID)
                request.sub = sub
                request.withCode = true
                request.lifetime = batch.lifetime ?? 3600
                if let minted = try? mintToken(request), let code = minted.code {
                    tokens.withLock { $0[index] = minted.idToken + " " + code }
                } else {
                    failures.withLock { $0 += 1 }
                }
                return
            }
            let claims: [String: JSONValue] = [
                "iss": .string(Self.issuer), "aud": .string(batch.clientID), "sub": .string(sub),
                "iat": .integer(now), "exp": .integer(now + Int64(batch.lifetime ?? 3600)), "auth_time": .integer(now),
                "email": .string("u\(number)@privaterelay.appleid.com"), "email_verified": true, "is_private_email": true,
                "real_user_status": 2, "nonce_supported": true,
            ]
            if let token = try? signer.sign(claims: claims) {
                tokens.withLock { $0[index] = token }
            } else {
                failures.withLock { $0 += 1 }
            }
        }
        guard failures.withLock({ $0 }) == 0 else { throw Problem.internalError }
        return tokens.withLock { $0.compactMap { $0 } }
    }

    /// Signed notification bodies for benchmarks, event times increasing with the index.
    func signNotificationBatch(_ batch: AdminEndpoints.NotificationBatch) throws -> [String] {
        let types = batch.types ?? ["email-disabled", "email-enabled"]
        let (keyID, key) = state.withLock { $0.signingKeys.last! }
        let signer = try JWSSigner(key: key, keyID: keyID)
        let now = Int64(Date().timeIntervalSince1970)
        let bodies = Lock<[String?]>(Array(repeating: nil, count: batch.count))
        DispatchQueue.concurrentPerform(iterations: batch.count) { index in
            let number = Int.random(in: 0..<batch.users)
            let sub = "001234." + String(repeating: "0", count: max(0, 32 - String(number).count)) + String(number) + ".0042"
            let event = JSONValue.object([
                "type": .string(types[index % types.count]), "sub": .string(sub),
                "event_time": .integer(now * 1000 + Int64(index)),
            ])
            let claims: [String: JSONValue] = [
                "iss": .string(Self.issuer), "aud": .string(batch.clientID), "iat": .integer(now), "exp": .integer(now + 86_400),
                "jti": .string(Hex.encode(SecureRandom.bytes(12))),
                "events": .string(String(decoding: event.serialized(), as: UTF8.self)),
            ]
            guard let token = try? signer.sign(claims: claims) else { return }
            let body = String(decoding: JSONValue.object(["payload": .string(token)]).serialized(), as: UTF8.self)
            bodies.withLock { $0[index] = body }
        }
        return bodies.withLock { $0.compactMap { $0 } }
    }

    /// An authorization code (single use, five minutes) for a user and client id.
    public func issueCode(teamID: String? = nil, sub: String, clientID: String, redirectURI: String? = nil, nonce: String? = nil)
        -> String
    {
        let code = "c" + Hex.encode(SecureRandom.bytes(16)) + ".0.sim." + Base64URL.encode(SecureRandom.bytes(6))
        state.withLock {
            $0.codes[code] = CodeGrant(
                teamID: teamID ?? defaultTeamID, sub: sub, clientID: clientID, redirectURI: redirectURI, nonce: nonce,
                expires: Date().addingTimeInterval(Self.codeLifetime), used: false)
        }
        return code
    }

    /// The user stops using Sign in with Apple for an app group (`clientID`'s; nil: every app
    /// of the team), as in Settings. With `FaultSettings.notificationURL` set, Apple then sends
    /// each group's `consent-revoked` there (DTS, forum 708415), by the delivery switches.
    /// Returns how many tokens died.
    @discardableResult
    public func revokeConsent(teamID: String? = nil, sub: String, clientID: String? = nil) -> Int {
        let team = teamID ?? defaultTeamID
        let (count, groups, url) = state.withLock { state in
            var count = 0
            var groups = Set(clientID.map { [state.primaryAppIDs[$0] ?? $0] } ?? [])
            let primary = clientID.map { state.primaryAppIDs[$0] ?? $0 }
            for (token, grant) in state.grants
            where grant.teamID == team && grant.sub == sub && !grant.revoked && grant.kind != "migration"
                && (primary == nil || (state.primaryAppIDs[grant.clientID] ?? grant.clientID) == primary)
            {
                state.grants[token]?.revoked = true
                groups.insert(state.primaryAppIDs[grant.clientID] ?? grant.clientID)
                count += 1
            }
            return (count, groups, state.faults.notificationURL)
        }
        if let url {
            let now = Int64(Date().timeIntervalSince1970 * 1000)
            for group in groups.sorted() {
                var notification = NotificationRequest(url: url, type: "consent-revoked", sub: sub, clientID: group)
                notification.eventTimeMilliseconds = now
                deliver(notification)
            }
        }
        return count
    }

    /// A password change: the user's refresh tokens stop working (`invalid_grant`), their
    /// authorization of the app stays (forum thread 651237; protocol reference §11.3).
    /// Returns how many tokens died.
    @discardableResult
    public func changePassword(teamID: String? = nil, sub: String) -> Int {
        let team = teamID ?? defaultTeamID
        return state.withLock { state in
            var count = 0
            for (token, grant) in state.grants
            where grant.teamID == team && grant.sub == sub && grant.kind == "refresh_token" && !grant.revoked && !grant.dead {
                state.grants[token]?.dead = true
                count += 1
            }
            return count
        }
    }

    /// The refresh tokens issued to a user (for assertions: the broker keeps them encrypted).
    public func refreshTokens(sub: String) -> [String] {
        state.withLock { state in state.grants.filter { $0.value.sub == sub && $0.value.kind == "refresh_token" }.map(\.key) }
    }

    /// Whether a refresh or access token is currently valid.
    public func isTokenValid(_ token: String) -> Bool {
        state.withLock { $0.grants[token].map { !$0.revoked && !$0.dead } ?? false }
    }

    // MARK: Observations and knobs

    /// Every `/auth/revoke` call so far, oldest first.
    public var revocations: [RevocationRecord] { state.withLock { $0.revocations } }

    public func clearRevocations() { state.withLock { $0.revocations.removeAll() } }

    /// Calls per endpoint.
    public var statistics: EndpointStatistics { state.withLock { $0.statistics } }

    /// The current fault settings.
    public var faults: FaultSettings {
        get { state.withLock { $0.faults } }
        set {
            state.withLock { $0.faults = newValue }
            appleClock.withLock { $0.draws = .init(seed: newValue.requestErrorSeed) }
        }
    }

    // MARK: Serving

    /// Serves the simulator's HTTP API on `listen` (`127.0.0.1:0` picks a port).
    /// - Returns: the bound port.
    @discardableResult
    public func start(listen: String = "127.0.0.1:0", threads: Int = 64) throws -> UInt16 {
        var router = Router()
        AppleEndpoints.register(on: &router, simulator: self)
        AdminEndpoints.register(on: &router, simulator: self)
        var configuration = HTTPServer.Configuration()
        configuration.listen = listen
        configuration.workerThreads = threads
        configuration.accessLog = false
        configuration.shutdownGracePeriod = .seconds(2)
        let server = HTTPServer(
            configuration: configuration, router: router, logger: logger.labelled("apple-sim-http"),
            metrics: MetricsRegistry())
        try server.start()
        self.server.withLock { $0 = server }
        return server.port
    }

    /// `http://127.0.0.1:<port>` once started.
    public var baseURL: String {
        "http://127.0.0.1:\(server.withLock { $0?.port ?? 0 })"
    }

    public func stop() {
        appleClock.withLock { $0.stopped = true }
        let running = server.withLock { value -> HTTPServer? in
            defer { value = nil }
            return value
        }
        running?.shutdown()
    }

    // MARK: Internals shared with the endpoints

    func teamFor(clientID: String) -> String {
        state.withLock { state in
            state.teams.values.first { $0.clientIDs.contains(clientID) }?.teamID ?? defaultTeamID
        }
    }

    /// Signs a JWT with the current RSA key.
    func signWithCurrentKey(_ claims: [String: JSONValue]) throws -> String {
        let (keyID, key) = state.withLock { $0.signingKeys.last! }
        return try JWSSigner(key: key, keyID: keyID).sign(claims: claims)
    }

    func identityToken(
        for user: SimulatedUser, clientID: String, request: TokenRequest?, code: String?, accessToken: String?,
        nonce: String? = nil
    ) throws -> String {
        let now = request?.issuedAt ?? Int(Date().timeIntervalSince1970)
        var claims: [String: JSONValue] = [
            "iss": .string(request?.issuer ?? Self.issuer), "aud": .string(clientID), "sub": .string(user.sub),
            "iat": .integer(Int64(now)), "exp": .integer(Int64(now + (request?.lifetime ?? 600))),
            "auth_time": .integer(Int64(request?.authTime ?? now)),
        ]
        if let raw = request?.rawNonce {
            claims["nonce"] = .string(SHA256.hexHash(raw))
        } else if let nonceClaim = request?.nonceClaim {
            claims["nonce"] = .string(nonceClaim)
        } else if let nonce {
            claims["nonce"] = .string(nonce)
        }
        claims["nonce_supported"] = .bool(request?.nonceSupported ?? true)
        if let code { claims["c_hash"] = .string(Self.halfHash(code)) }
        if let accessToken { claims["at_hash"] = .string(Self.halfHash(accessToken)) }
        if let orgID = user.orgID
            ?? (request?.managedAccount == true || request?.schoolAccount == true ? "org.\(user.sub.prefix(8))" : nil)
        {
            claims["org_id"] = .string(orgID)
        }
        if request?.schoolAccount == true {
            // Apple School Manager: an empty email, email_verified false (§10.5, §11.7).
            claims["email"] = ""
            claims["email_verified"] = false
        } else if request?.omitEmail != true, let email = user.email {
            let strings = request?.booleansAsStrings == true
            claims["email"] = .string(email)
            claims["email_verified"] = strings ? "true" : true
            // Apple leaves is_private_email out for real addresses.
            if user.isPrivateEmail { claims["is_private_email"] = strings ? "true" : true }
        }
        // Apple sends real_user_status to native apps only; web tokens carry none (§10.5).
        if request?.omitRealUserStatus != true {
            claims["real_user_status"] = .integer(Int64(request?.realUserStatus ?? user.realUserStatus))
        }
        // A migrated user's tokens carry the transfer_sub for the transfer's 60 days (TN3159).
        if let transferSub = request?.transferSub ?? openTransferSub(of: user) { claims["transfer_sub"] = .string(transferSub) }
        return try signWithCurrentKey(claims)
    }

    /// The transfer_sub that brought `user` to its team, while the transfer's window is open.
    func openTransferSub(of user: SimulatedUser) -> String? {
        state.withLock { state in
            state.transfers.first {
                $0.value.toTeam == user.teamID && $0.value.toSub == user.sub && Self.isOpen($0.value, faults: state.faults)
            }?.key
        }
    }

    /// OIDC `c_hash`/`at_hash`: base64url of the left half of SHA-256.
    static func halfHash(_ value: String) -> String {
        Base64URL.encode(SHA256.hash(value).prefix(16))
    }

    static func makeKeyID() -> String {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
        return String((0..<10).map { _ in alphabet.randomElement()! })
    }
}
