import AppleID
import Foundation
import PostgresClient
import StrictJSON

/// The body of `POST /v1/apple/login`.
public struct LoginRequest: Sendable {
    /// The identity token from `ASAuthorizationAppleIDCredential.identityToken`.
    public var identityToken: String
    /// The authorization code, to exchange for a refresh token.
    public var authorizationCode: String?
    /// The nonce the app generated; its hex SHA-256 went into the Apple request.
    public var rawNonce: String?
    /// Apple's first-authorization `user` object (name and e-mail, unsigned).
    public var user: AppleUserField?
    /// Which of the configured client ids the token is for (optional).
    public var clientID: String?
    /// The `redirect_uri` the code was issued for, when it came from a web authorization
    /// request (Sign in with Apple JS, an Android library, or the broker's own web sign-in):
    /// Apple binds the code to it and refuses an exchange without the same value (§10.4).
    /// nil for native codes, which must be exchanged without one. From an app backend it
    /// must be registered for the token's client id (`APPLE_REDIRECT_URIS`).
    public var redirectURI: String?
    /// The broker's own callback URL, set by its web sign-in (no registration check).
    package var redirectURIIsOurs = false
    /// The client ids the calling API key may log in (nil: every one): a token for another
    /// `aud` is refused with 403 `client_not_allowed` before its code is exchanged.
    package var allowedClientIDs: Set<String>?
    /// Runs once the identity token verified, before the code is exchanged: the web
    /// callback spends its single-use state here, so only a real sign-in costs a row.
    package var afterVerification: (@Sendable (AppleIdentity) throws -> Void)?

    public init(
        identityToken: String, authorizationCode: String? = nil, rawNonce: String? = nil, user: AppleUserField? = nil,
        clientID: String? = nil
    ) {
        self.identityToken = identityToken
        self.authorizationCode = authorizationCode
        self.rawNonce = rawNonce
        self.user = user
        self.clientID = clientID
    }

    /// Reads the JSON body (`user` may be an object or Apple's JSON string).
    public init(_ body: JSONObjectReader) throws {
        identityToken = try body.requiredString("identity_token")
        authorizationCode = try body.string("authorization_code")
        rawNonce = try body.string("raw_nonce")
        clientID = try body.string("client_id")
        redirectURI = try body.string("redirect_uri")
        user = try AppleUserField(body, key: "user")
    }

    /// Bounds that keep absurd input out of the database and logs.
    package func validate() throws {
        func check(_ value: String?, _ field: String, _ limit: Int) throws {
            guard let value else { return }
            guard !value.isEmpty else { throw BrokerError.invalidRequest("field `\(field)` must not be empty") }
            guard value.utf8.count <= limit else {
                throw BrokerError.invalidRequest("field `\(field)` is longer than \(limit) bytes")
            }
        }
        try check(identityToken, "identity_token", 16 * 1024)
        try check(authorizationCode, "authorization_code", 2048)
        try check(rawNonce, "raw_nonce", 512)
        try check(clientID, "client_id", 256)
        try check(redirectURI, "redirect_uri", 2048)
        try check(user?.name?.firstName, "user.name.firstName", 256)
        try check(user?.name?.lastName, "user.name.lastName", 256)
        try check(user?.email, "user.email", 320)
    }
}

/// Apple's `user` JSON from the first authorization: `{"name":{"firstName","lastName"},"email"}`.
/// Accepted as an object or as the JSON string the web flow delivers; unknown members
/// (`middleName`) are ignored.
public struct AppleUserField: Sendable, Equatable {
    public struct Name: Sendable, Equatable {
        public var firstName: String?
        public var lastName: String?

        public init(firstName: String?, lastName: String?) {
            self.firstName = firstName
            self.lastName = lastName
        }
    }

    public var name: Name?
    public var email: String?

    public init(name: Name?, email: String?) {
        self.name = name
        self.email = email
    }

    /// The `key` member of `body`, object or JSON string; nil when absent.
    init?(_ body: JSONObjectReader, key: String) throws {
        let object: JSONObjectReader
        switch body.members[key] {
        case nil, .null?:
            return nil
        case .string(let text)?:
            guard let members = try? JSONValue.parseObject(Array(text.utf8)) else {
                throw BrokerError.invalidRequest("field `\(key)` is not a JSON object")
            }
            object = JSONObjectReader(members: members, path: key)
        default:
            guard let nested = try body.object(key) else { return nil }
            object = nested
        }
        let name = try object.object("name")
        self.name = try name.map { Name(firstName: try $0.string("firstName"), lastName: try $0.string("lastName")) }
        email = try object.string("email")
    }

    /// Builds one from decoded JSON text (the web flow's form field).
    public init?(jsonText: String) throws {
        guard let members = try? JSONValue.parseObject(Array(jsonText.utf8)) else { return nil }
        try self.init(JSONObjectReader(members: ["user": .object(members)], path: ""), key: "user")
    }
}

/// The answer to a successful login (DESIGN.md §4).
public struct LoginResponse: Sendable, Equatable {
    public struct Risk: Sendable, Equatable {
        public var suggestChallenge: Bool
    }

    public var userID: UUID
    public var appleSub: String
    public var isNewUser: Bool
    public var email: String?
    public var emailVerified: Bool
    public var isPrivateEmail: Bool
    public var realUserStatus: RealUserStatus
    public var refreshTokenStored: Bool
    public var status: UserStatus
    public var risk: Risk
    /// The e-mail Apple's unsigned first-authorization `user` field named, when the verified
    /// token had another or none. Never verified: do not link accounts by it.
    public var unverifiedEmail: String? = nil
    /// What became of the request's authorization code.
    public var codeExchange: CodeExchange = .none

    /// `code_exchange`: what became of the login's authorization code.
    public enum CodeExchange: String, Sendable, CaseIterable {
        /// Exchanged now; its refresh token is stored.
        case exchanged
        /// An earlier request with the same code exchanged it.
        case alreadyExchanged = "already_exchanged"
        /// Not sent: an earlier exchange of it lost Apple's answer, and a code goes to Apple once.
        case spent
        /// Not sent: the user's hourly budget of code exchanges is spent; the verified sign-in
        /// goes on without it (`login_code_unsendable_total{outcome="over_budget"}`).
        case overBudget = "over_budget"
        /// The request carried no code.
        case none
    }

    /// The JSON body (built directly: this is on every login's path).
    public var json: JSONValue {
        .object([
            "user_id": .string(userID.lowercasedString), "apple_sub": .string(appleSub),
            "is_new_user": .bool(isNewUser), "email": email.map(JSONValue.string) ?? .null,
            "email_verified": .bool(emailVerified), "is_private_email": .bool(isPrivateEmail),
            "real_user_status": .string(realUserStatus.rawValue), "refresh_token_stored": .bool(refreshTokenStored),
            "status": .string(status.rawValue), "risk": .object(["suggest_challenge": .bool(risk.suggestChallenge)]),
            "unverified_email": unverifiedEmail.map(JSONValue.string) ?? .null,
            "code_exchange": .string(codeExchange.rawValue),
        ])
    }
}
