import Foundation
import HTTPServer

/// The body of `POST /v1/apple/login`.
public struct LoginRequest: Decodable, Sendable {
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

    enum CodingKeys: String, CodingKey {
        case identityToken = "identity_token"
        case authorizationCode = "authorization_code"
        case rawNonce = "raw_nonce"
        case user
        case clientID = "client_id"
    }

    /// Bounds that keep absurd input out of the database and logs.
    func validate() throws {
        func check(_ value: String?, _ field: String, _ limit: Int) throws {
            guard let value else { return }
            guard !value.isEmpty else { throw Problem.badRequest("field `\(field)` must not be empty") }
            guard value.utf8.count <= limit else { throw Problem.badRequest("field `\(field)` is longer than \(limit) bytes") }
        }
        try check(identityToken, "identity_token", 16 * 1024)
        try check(authorizationCode, "authorization_code", 2048)
        try check(rawNonce, "raw_nonce", 512)
        try check(clientID, "client_id", 256)
        try check(user?.name?.firstName, "user.name.firstName", 256)
        try check(user?.name?.lastName, "user.name.lastName", 256)
        try check(user?.email, "user.email", 320)
    }
}

/// Apple's `user` JSON from the first authorization: `{"name":{"firstName","lastName"},"email"}`.
/// Accepted as an object or as the JSON string the web flow delivers; unknown members
/// (`middleName`) are ignored.
public struct AppleUserField: Decodable, Sendable, Equatable {
    public struct Name: Decodable, Sendable, Equatable {
        public var firstName: String?
        public var lastName: String?
    }

    public var name: Name?
    public var email: String?

    public init(name: Name?, email: String?) {
        self.name = name
        self.email = email
    }

    enum CodingKeys: String, CodingKey { case name, email }

    public init(from decoder: any Decoder) throws {
        if let text = try? decoder.singleValueContainer().decode(String.self) {
            guard let parsed = try? JSONDecoder().decode(AppleUserField.self, from: Data(text.utf8)) else {
                throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "user is not JSON"))
            }
            self = parsed
            return
        }
        let container = try decoder.container(keyedBy: CodingKeys.self)
        name = try container.decodeIfPresent(Name.self, forKey: .name)
        email = try container.decodeIfPresent(String.self, forKey: .email)
    }
}

/// The answer to a successful login (DESIGN.md §4).
public struct LoginResponse: Encodable, Sendable, Equatable {
    public struct Risk: Encodable, Sendable, Equatable {
        public var suggestChallenge: Bool
        enum CodingKeys: String, CodingKey { case suggestChallenge = "suggest_challenge" }
    }

    public var userID: UUID
    public var appleSub: String
    public var isNewUser: Bool
    public var email: String?
    public var emailVerified: Bool
    public var isPrivateEmail: Bool
    public var realUserStatus: String
    public var refreshTokenStored: Bool
    public var status: String
    public var risk: Risk

    enum CodingKeys: String, CodingKey {
        case userID = "user_id"
        case appleSub = "apple_sub"
        case isNewUser = "is_new_user"
        case email
        case emailVerified = "email_verified"
        case isPrivateEmail = "is_private_email"
        case realUserStatus = "real_user_status"
        case refreshTokenStored = "refresh_token_stored"
        case status, risk
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(userID.uuidString.lowercased(), forKey: .userID)
        try container.encode(appleSub, forKey: .appleSub)
        try container.encode(isNewUser, forKey: .isNewUser)
        try container.encode(email, forKey: .email)  // null when Apple never shared one
        try container.encode(emailVerified, forKey: .emailVerified)
        try container.encode(isPrivateEmail, forKey: .isPrivateEmail)
        try container.encode(realUserStatus, forKey: .realUserStatus)
        try container.encode(refreshTokenStored, forKey: .refreshTokenStored)
        try container.encode(status, forKey: .status)
        try container.encode(risk, forKey: .risk)
    }
}
