import AppleID
import BrokerCrypto
import Foundation
import Observability
import PostgresClient

/// `POST /v1/apple/login`: verifies the identity token, exchanges the authorization code
/// (once), stores the refresh token encrypted, upserts the user, and answers with who the
/// user is. Nothing is written for a rejected login.
public final class LoginService: Sendable {
    let validator: IdentityTokenValidator
    let apple: AppleClient
    let store: LoginStore
    let ledger: CodeExchangeStore
    let tokenKeys: TokenKeyRing
    let teamID: String
    let settings: BrokerConfiguration.LoginSettings
    let validationInterval: Duration
    let retry: RetryPolicy
    /// `APPLE_REDIRECT_URIS`: the Return URLs app backends may pass as `redirect_uri`, per client id.
    let redirectURIs: [String: Set<String>]
    /// Called after a login that may have written outbox events (wakes local dispatchers).
    let eventsWritten: @Sendable () -> Void
    private let outcomes: CounterFamily
    private let successes: CounterFamily
    private let newUsers: CounterFamily
    private let codeOutcomes: CounterFamily

    package init(
        validator: IdentityTokenValidator, apple: AppleClient, pool: PostgresPool, tokenKeys: TokenKeyRing, teamID: String,
        settings: BrokerConfiguration.LoginSettings, validationInterval: Duration, retry: RetryPolicy, metrics: MetricsRegistry,
        groups: AppGroups, redirectURIs: [String: Set<String>], eventsWritten: @escaping @Sendable () -> Void = {}
    ) {
        self.redirectURIs = redirectURIs
        self.eventsWritten = eventsWritten
        self.validator = validator
        self.apple = apple
        self.store = LoginStore(
            pool: pool, teamID: teamID, lastLoginResolution: settings.lastLoginResolution,
            groups: groups, hasher: SubjectHasher(keys: tokenKeys), repeatSignIns: RepeatSignInStore(pool: pool))
        self.ledger = CodeExchangeStore(pool: pool, hasher: SubjectHasher(keys: tokenKeys), teamID: teamID)
        self.tokenKeys = tokenKeys
        self.teamID = teamID
        self.settings = settings
        self.validationInterval = validationInterval
        self.retry = retry
        outcomes = metrics.counter(
            "login_requests_total", help: "Logins by outcome: success or the problem code.", labels: ["outcome"])
        successes = metrics.counter(
            "login_success_total", help: "Successful logins by relay e-mail and real_user_status.",
            labels: ["private_email", "real_user_status"])
        newUsers = metrics.counter(
            "login_new_users_total", help: "Users created by a login, by whether their e-mail is an Apple relay (Hide My Email).",
            labels: ["private_email"])
        codeOutcomes = metrics.counter(
            "login_code_unsendable_total",
            help:
                "Codes not sent to Apple (again): answer_lost (a code grant got no usable answer), spent (a retry of such a code), over_budget (the user's hourly exchanges are spent; signed in without it).",
            labels: ["outcome"])
    }

    public func login(_ request: LoginRequest) throws -> LoginResponse {
        do {
            let response = try perform(request)
            outcomes.increment("success")
            successes.increment(String(response.isPrivateEmail), response.realUserStatus.rawValue)
            if response.isNewUser { newUsers.increment(String(response.isPrivateEmail)) }
            return response
        } catch let error as BrokerError {
            outcomes.increment(error.code.rawValue)
            // A first authorization's name comes once (P7): when Apple could not exchange the
            // code of a verified sign-in, the user and the `user` field are kept all the same
            // (the token is verified again; an unverified one keeps nothing).
            if Self.exchangeFailures.contains(error.code), request.authorizationCode != nil,
                request.user?.name != nil || request.user?.email != nil
            {
                _ = try? keepUserAfterFailedExchange(request)
            }
            throw error
        } catch let rejection as TokenRejection {
            outcomes.increment(rejection.code.rawValue)
            throw rejection
        } catch let error as PostgresError where error.isUnavailable {
            outcomes.increment("database_unavailable")
            throw error
        }
    }

    /// Login problems that come after the identity token verified: Apple could not exchange the code.
    package static let exchangeFailures: Set<BrokerError.Code> = [
        .authorizationCodeInvalid, .appleClientRejected, .appleResponseInvalid, .appleUnavailable,
    ]

    /// Saves the verified user of a sign-in whose code exchange already failed (and was
    /// counted as that failure): the web callback keeps the name Apple sends only once.
    /// Not counted in `login_requests_total`, so one sign-in is one outcome.
    package func keepUserAfterFailedExchange(_ request: LoginRequest) throws -> LoginResponse {
        var request = request
        request.authorizationCode = nil
        request.redirectURI = nil
        request.afterVerification = nil
        return try perform(request)
    }

    private func perform(_ request: LoginRequest) throws -> LoginResponse {
        try request.validate()
        let identity: AppleIdentity
        do {
            identity = try validator.validate(request.identityToken, rawNonce: request.rawNonce, clientIDHint: request.clientID)
        } catch AppleKeyError.unavailable {
            throw BrokerError.appleUnavailable("Apple's signing keys cannot be fetched")
        }
        if let allowed = request.allowedClientIDs, !allowed.contains(identity.clientID) {
            throw BrokerError.clientNotAllowed(identity.clientID)
        }
        try request.afterVerification?(identity)

        if let redirectURI = request.redirectURI, !request.redirectURIIsOurs,
            !(redirectURIs[identity.clientID]?.contains(redirectURI) ?? false)
        {
            // Refused before Apple: an unregistered redirect_uri cannot be Apple's either.
            throw BrokerError(
                .redirectURINotRegistered,
                "redirect_uri is not one of the Return URLs registered for this client id (APPLE_REDIRECT_URIS)")
        }
        // A code that is not the one issued with this token (its c_hash) never reaches Apple:
        // a login key plus one valid token must not buy calls to Apple with arbitrary codes.
        if let code = request.authorizationCode, !identity.matches(code: code) {
            throw BrokerError(.authorizationCodeInvalid, "the authorization code does not match the identity token's c_hash")
        }
        // An identity token from before a consent-revoked never restores the consent (nor is its
        // code sent): the user must sign in again (protocol reference §11.5). A user whose
        // deletion is pending is refused before the code is exchanged: the refresh token it
        // would yield would be thrown away, yet live at Apple. Without a code, the login's own
        // first statement says both (store.login), so a repeat login is one round trip.
        if request.authorizationCode != nil {
            switch try store.beforeExchange(identity) {
            case .ok: break
            case .predatesRevocation: throw Self.predatesRevocation
            case .deletionPending: throw BrokerError.deletionPending
            }
        }
        var sealed: (keyID: String, sealed: [UInt8])?
        var sealedAccess: (keyID: String, sealed: [UInt8], expiresIn: Int)?
        var claimedCode: String?
        // When Apple vouched for the authorization, in Apple's time (protocol reference §12.1):
        // the token's `iat`, or the id_token of a code Apple exchanges now.
        var signedInAt = identity.issuedAt
        var exchangedAt: Date?
        var codeExchange = LoginResponse.CodeExchange.none
        if let code = request.authorizationCode {
            switch try ledger.claim(code, clientID: identity.clientID, sub: identity.sub) {
            case .alreadyExchanged:
                codeExchange = .alreadyExchanged
            case .spent:
                // The first attempt's answer was lost: the login goes on without a token
                // (refresh_token_stored false) rather than send the code twice.
                codeOutcomes.increment("spent")
                codeExchange = .spent
            case .overBudget:
                // Apple bounds nothing per user (§12.5): the verified sign-in goes on, the code
                // is not sent (refresh_token_stored as before).
                codeOutcomes.increment("over_budget")
                codeExchange = .overBudget
            case .claimed:
                claimedCode = code
                do {
                    let tokens = try exchange(code, for: identity, redirectURI: request.redirectURI)
                    let owner = SealedAppleToken.Owner(teamID: teamID, sub: identity.sub, clientID: identity.clientID)
                    let refresh = try SealedAppleToken(sealing: tokens.refreshToken, as: .refresh, for: owner, keys: tokenKeys)
                    sealed = (refresh.keyID, refresh.sealed)
                    // Kept until it expires: Apple's revoke accepts it as well (§10.3).
                    let access = try SealedAppleToken(sealing: tokens.accessToken, as: .access, for: owner, keys: tokenKeys)
                    sealedAccess = (access.keyID, access.sealed, tokens.expiresIn)
                    exchangedAt = tokens.exchangedAt
                    signedInAt = max(signedInAt, tokens.exchangedAt)
                    codeExchange = .exchanged
                } catch let throttled as Throttled {
                    // Apple refused the call before using the code (429): it stays good, so the
                    // ledger lets go of it and a retry of this login exchanges it.
                    ledger.finish(code, succeeded: false)
                    throw throttled.error
                } catch let error as BrokerError where error.code == .appleUnavailable || error.code == .appleResponseInvalid {
                    // Sent, and no usable answer: Apple may have consumed the code (§11.4).
                    codeOutcomes.increment("answer_lost")
                    ledger.finishSpent(code)
                    throw error
                } catch let error as BrokerError {
                    // A refusal is remembered for a retry with the same code.
                    ledger.finish(code, succeeded: false, errorCode: error.code.isRefusal ? error.code : nil)
                    throw error
                } catch {
                    ledger.finish(code, succeeded: false)
                    throw error
                }
            }
        }

        let record: LoginStore.Record
        do {
            record = try store.login(
                identity, user: request.user, sealedRefreshToken: sealed, validationInterval: validationInterval,
                signedInAt: signedInAt, tokenAuthorizedAt: exchangedAt)
        } catch {
            // The code was exchanged: sending it again could only be refused.
            if let claimedCode, sealed != nil {
                ledger.finishSpent(claimedCode)
            } else if let claimedCode {
                ledger.finish(claimedCode, succeeded: false)
            }
            throw error
        }
        if let claimedCode { ledger.finish(claimedCode, succeeded: record.outcome == .ok) }
        if let sealedAccess, record.outcome == .ok {
            try? store.keepAccessToken(
                sub: identity.sub, clientID: identity.clientID, sealed: sealedAccess.sealed, keyID: sealedAccess.keyID,
                expiresIn: sealedAccess.expiresIn)
        }
        if record.wroteThrough { eventsWritten() }
        switch record.outcome {
        case .ok: break
        case .deletionPending: throw BrokerError.deletionPending
        case .predatesRevocation: throw Self.predatesRevocation
        }
        let realUserStatus = record.realUserStatus ?? .unsupported
        let challenge: Bool =
            switch realUserStatus {
            case .likelyReal: false
            case .unknown: settings.challengeUnknown
            case .unsupported: settings.challengeUnsupported
            }
        return LoginResponse(
            userID: record.userID, appleSub: identity.sub, isNewUser: record.isNewUser, email: record.email,
            emailVerified: record.emailVerified, isPrivateEmail: record.isPrivateEmail, realUserStatus: realUserStatus,
            refreshTokenStored: record.refreshTokenStored, status: .active, risk: .init(suggestChallenge: challenge),
            unverifiedEmail: record.unverifiedEmail, codeExchange: codeExchange)
    }

    static let predatesRevocation = TokenRejection(
        .tokenTooOld, "the token was issued before the user revoked this app's consent: sign in again")

    /// Exchanges an authorization code (with the redirect_uri of a web authorization, none
    /// for a native code) and checks that the id_token Apple returns names the same user.
    /// `exchangedAt` is that id_token's `iat`: when Apple vouched for the authorization.
    /// Apple throttled a code exchange (429): `error` is the login's answer, and the code is
    /// still unused.
    private struct Throttled: Error {
        let error: BrokerError
    }

    private func exchange(_ code: String, for identity: AppleIdentity, redirectURI: String?) throws
        -> (refreshToken: String, accessToken: String, expiresIn: Int, exchangedAt: Date)
    {
        let tokens: AppleTokenResponse
        do {
            tokens = try apple.exchangeCode(code, clientID: identity.clientID, redirectURI: redirectURI)
        } catch let error as AppleAPIError where error.isTooManyRequests {
            // The only try was answered 429 (a code is sent once, so no earlier try could have
            // used it): Apple throttled the call and did nothing with the code (TN3194).
            throw Throttled(
                error: BrokerError(
                    .appleUnavailable,
                    "Apple answered 429 (too many requests) before using the authorization code: retry this login with the same code after Retry-After",
                    retryAfterSeconds: max(error.retryAfter ?? 5, 1)))
        } catch let error as AppleAPIError {
            throw BrokerError(error)
        }
        guard let refreshToken = tokens.refreshToken, let idToken = tokens.idToken else {
            throw BrokerError.appleUnavailable("Apple's token answer lacked a refresh token")
        }
        let returned: AppleIdentity
        do {
            returned = try validator.validate(idToken, rawNonce: nil, clientIDHint: identity.clientID, checkAge: false)
        } catch {
            throw BrokerError(.appleResponseInvalid, "the id_token returned by Apple did not verify")
        }
        guard returned.sub == identity.sub else {
            throw BrokerError(.authorizationCodeInvalid, "the authorization code belongs to another user than the identity token")
        }
        return (refreshToken, tokens.accessToken, tokens.expiresIn ?? 3600, returned.issuedAt)
    }
}
