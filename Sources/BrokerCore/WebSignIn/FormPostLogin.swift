import AppleID
import Foundation
import Locking
import Synchronization

/// The sign-in inside Apple's form post, shared by the web sign-in and the OpenID Provider:
/// the identity token and its nonce verified, the state spent once (only then: a forged post
/// costs no row, a replayed real one is refused before its code is used), Apple's code
/// exchanged with the broker's callback as `redirect_uri`, the user upserted keeping the
/// unsigned name Apple sends only once (P7).
package struct FormPostLogin: Sendable {
    let login: LoginService
    let usedStates: WebSignInStore

    package init(login: LoginService, usedStates: WebSignInStore) {
        self.login = login
        self.usedStates = usedStates
    }

    package enum Outcome: Sendable {
        /// Signed in; `authenticatedAt`: when Apple last authenticated the person (the identity
        /// token's `auth_time`, else its `iat`; never later than now).
        case signedIn(LoginResponse, authenticatedAt: Date)
        /// The state was spent by an earlier post (the Back button, a double submit).
        case stateAlreadyUsed
        /// Refused: the problem code (a `BrokerError` code, or a `TokenRejection` code when
        /// `rejected`). The user and name are kept when Apple's token verified.
        case failed(code: String, rejected: Bool, brokerCode: BrokerError.Code?)
    }

    private struct StateAlreadyUsed: Error {}

    /// What the verification step saw, read after the login returns.
    private final class AuthenticationTime: Sendable {
        let value = Lock<Date?>(nil)
    }

    /// Signs in with the form's `id_token`, `code` and `user` for a state sealed with `rawNonce`.
    package func signIn(
        idToken: String, code: String, userField: String?, rawNonce: String, clientID: String, callbackURL: String,
        state: String, stateExpiresAt: Int
    ) throws -> Outcome {
        // Names over the login's 256-byte bound are dropped rather than failing the sign-in.
        func bounded(_ text: String?) -> String? { text.flatMap { $0.utf8.count <= 256 && !$0.isEmpty ? $0 : nil } }
        let sent = userField.flatMap { try? AppleUserField(jsonText: $0) }?.name
        let name = sent.map { AppleUserField.Name(firstName: bounded($0.firstName), lastName: bounded($0.lastName)) }
        // Only the name is taken from the unsigned `user`; the e-mail comes from the token.
        var request = LoginRequest(
            identityToken: idToken, authorizationCode: code, rawNonce: rawNonce,
            user: name.map { AppleUserField(name: $0, email: nil) }, clientID: clientID)
        request.redirectURI = callbackURL
        request.redirectURIIsOurs = true
        let usedStates = usedStates
        let authenticated = AuthenticationTime()
        request.afterVerification = { identity in
            guard try usedStates.markUsed(state: state, expiresAt: stateExpiresAt) else { throw StateAlreadyUsed() }
            authenticated.value.withLock { $0 = identity.authTime ?? identity.issuedAt }
        }
        do {
            let response = try login.login(request)
            let at = authenticated.value.withLock { $0 } ?? Date()
            return .signedIn(response, authenticatedAt: min(at, Date()))
        } catch is StateAlreadyUsed {
            return .stateAlreadyUsed
        } catch let error as BrokerError {
            if WebSignInService.exchangeFailures.contains(error.code) {
                // The token verified but the code could not be exchanged: still keep the user
                // and the name Apple will not send again; the app can simply retry.
                _ = try? login.keepUserAfterFailedExchange(request)
            }
            return .failed(code: error.code.rawValue, rejected: false, brokerCode: error.code)
        } catch let rejection as TokenRejection {
            return .failed(code: rejection.code.rawValue, rejected: true, brokerCode: nil)
        }
    }
}
