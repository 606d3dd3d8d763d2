import AppleID
import BrokerCrypto
import Foundation
import PostgresClient

/// Exchanges the authorization code handed over with a deletion request (the app
/// re-authenticated the user to delete the account, TN3194), checks that Apple's `id_token`
/// names the user being deleted, and keeps the tokens it yields for the revoke.
///
/// Apple's codes live five minutes, so the compliance API runs this in the request, before
/// it answers (a queue can be slower than that), also when the code reaches a request that is
/// already open; the deletion job runs it too, for a code the request could not get to. The
/// code is taken from the request atomically first: it goes to Apple at most once (protocol
/// reference §11.4) when its answer is lost. A 429 is no lost answer: Apple did nothing with
/// the code, which goes back to the request and is tried again after `Retry-After`.
package struct HandedOverCode: Sendable {
    let store: DeletionStore
    let apple: AppleClient
    let tokenKeys: TokenKeyRing
    let validator: IdentityTokenValidator

    package init(store: DeletionStore, apple: AppleClient, tokenKeys: TokenKeyRing, validator: IdentityTokenValidator) {
        self.store = store
        self.apple = apple
        self.tokenKeys = tokenKeys
        self.validator = validator
    }

    /// How long an exchange in the API's request holds its deletion back from the job.
    package static let requestLease: Duration = .seconds(60)

    /// Apple throttled the exchange (429): the code went back to the request, for another try
    /// after `retryAfter` seconds.
    package struct Throttled: Error {
        package let retryAfter: Int
    }

    /// Every outcome is a `code_exchange` step: `exchanged`, `code_invalid`, `answer_lost`,
    /// `throttled`, `wrong_user`, `id_token_invalid`, `undecryptable`, `no_identity`.
    /// - Parameter inRequest: called by the API: the exchange is marked under way until it is
    ///   over, so the job does not end the revoke phase without what it yields (and a request
    ///   no job has claimed yet is held back from the job).
    /// - Throws: `Throttled` when Apple answered 429 (the code is back on the request).
    package func exchange(deletionID: UUID, userID: UUID, inRequest: Bool = false) throws {
        guard let code = try store.takeCode(deletionID, lease: inRequest ? Self.requestLease : nil) else { return }
        defer { if inRequest { try? store.releaseLease(deletionID) } }
        func step(_ outcome: DeletionStepOutcome, _ detail: String? = nil, clientID: String? = nil) throws {
            try store.addStep(deletionID, step: .codeExchange, clientID: clientID, outcome: outcome, detail: detail)
        }
        guard
            let plain = try? tokenKeys.open(
                code.sealed, keyID: code.keyID, associatedData: DeletionStore.SealedCode.associatedData(userID: userID))
        else { return try step(.undecryptable, "the handed-over code cannot be decrypted") }
        let identities = try store.identities(of: userID)
        guard let clientID = code.clientID ?? identities.first?.clientID else {
            return try step(.noIdentity, "the user has no identity in this team")
        }
        let tokens: AppleTokenResponse
        do {
            tokens = try apple.exchangeCode(
                String(decoding: plain, as: UTF8.self), clientID: clientID, redirectURI: code.redirectURI)
        } catch let error as AppleAPIError where error.isTooManyRequests {
            // Throttled, not lost: Apple refused the call before using the code.
            let retryAfter = max(error.retryAfter ?? 1, 1)
            if try store.putCodeBack(deletionID, code, afterSeconds: retryAfter) {
                try step(
                    .throttled, "Apple answered 429: the code was not used; tried again in \(retryAfter) s", clientID: clientID)
                throw Throttled(retryAfter: retryAfter)
            }
            return try step(.codeInvalid, "Apple answered 429 and the deletion moved on meanwhile", clientID: clientID)
        } catch AppleAPIError.unavailable(let reason, _) {
            // Sent once and no answer: Apple may have used it up; it is not sent again.
            return try step(.answerLost, reason, clientID: clientID)
        } catch let error as AppleAPIError {
            return try step(.codeInvalid, "Apple refused the code: \(error.kind)", clientID: clientID)
        }
        guard let refreshToken = tokens.refreshToken, let idToken = tokens.idToken,
            let returned = try? validator.validate(idToken, rawNonce: nil, clientIDHint: clientID, checkAge: false)
        else {
            return try step(.idTokenInvalid, "Apple's answer lacked a refresh token or a verifiable id_token", clientID: clientID)
        }
        guard let identity = identities.first(where: { $0.sub == returned.sub }) else {
            // Another user's code: their grant is none of this deletion's business.
            return try step(.wrongUser, "the code belongs to another user than the one being deleted", clientID: clientID)
        }
        let owner = SealedAppleToken.Owner(teamID: store.teamID, sub: identity.sub, clientID: clientID)
        let sealedRefresh = try SealedAppleToken(sealing: refreshToken, as: .refresh, for: owner, keys: tokenKeys)
        let sealedAccess = try SealedAppleToken(sealing: tokens.accessToken, as: .access, for: owner, keys: tokenKeys)
        try store.keepExchangedTokens(
            identityID: identity.id, userID: userID, clientID: clientID,
            refresh: (sealedRefresh.sealed, sealedRefresh.keyID),
            access: (sealedAccess.sealed, sealedAccess.keyID, tokens.expiresIn ?? 3600))
        try step(.exchanged, clientID: clientID)
    }
}
