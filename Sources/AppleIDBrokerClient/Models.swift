import Foundation

/// The body of `POST /v1/apple/login`.
public struct LoginRequest: Sendable, Encodable {
    public struct User: Sendable, Encodable {
        public struct Name: Sendable, Encodable {
            public var firstName: String?
            public var lastName: String?
            public init(firstName: String? = nil, lastName: String? = nil) {
                self.firstName = firstName
                self.lastName = lastName
            }
        }
        public var name: Name?
        public var email: String?
        public init(name: Name? = nil, email: String? = nil) {
            self.name = name
            self.email = email
        }
    }

    public var identityToken: String
    public var authorizationCode: String?
    /// The raw nonce the app made; its lowercase hex SHA-256 went into the Apple request.
    public var rawNonce: String?
    /// Apple's first-authorization name and e-mail (sent once; unsigned).
    public var user: User?
    public var clientID: String?
    /// The `redirect_uri` of a web authorization code (registered in `APPLE_REDIRECT_URIS`).
    public var redirectURI: String?

    public init(
        identityToken: String, authorizationCode: String? = nil, rawNonce: String? = nil, user: User? = nil,
        clientID: String? = nil, redirectURI: String? = nil
    ) {
        self.identityToken = identityToken
        self.authorizationCode = authorizationCode
        self.rawNonce = rawNonce
        self.user = user
        self.clientID = clientID
        self.redirectURI = redirectURI
    }

    enum CodingKeys: String, CodingKey {
        case identityToken = "identity_token"
        case authorizationCode = "authorization_code"
        case rawNonce = "raw_nonce"
        case user
        case clientID = "client_id"
        case redirectURI = "redirect_uri"
    }
}

/// Who signed in.
public struct LoginResponse: Sendable, Decodable, Equatable {
    public struct Risk: Sendable, Decodable, Equatable {
        public var suggestChallenge: Bool
        enum CodingKeys: String, CodingKey { case suggestChallenge = "suggest_challenge" }
    }

    public var userID: String
    public var appleSub: String
    public var isNewUser: Bool
    /// From the verified token only.
    public var email: String?
    public var emailVerified: Bool
    public var isPrivateEmail: Bool
    /// `likely_real`, `unknown` or `unsupported`.
    public var realUserStatus: String
    public var refreshTokenStored: Bool
    public var status: String
    public var risk: Risk
    /// Apple's unsigned first-authorization e-mail when the token had another or none: never
    /// verified, never link accounts by it.
    public var unverifiedEmail: String?
    /// What became of the authorization code: `exchanged`, `already_exchanged`, `spent`,
    /// `over_budget` (the user's hourly exchanges are spent; signed in without it) or `none`.
    public var codeExchange: String?

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
        case unverifiedEmail = "unverified_email"
        case codeExchange = "code_exchange"
    }
}

/// `GET /v1/users/{id}`.
public struct User: Sendable, Decodable {
    public struct Identity: Sendable, Decodable {
        public var appleSub: String
        public var teamID: String
        public var clientID: String
        public var email: String?
        public var emailVerified: Bool
        public var isPrivateEmail: Bool
        public var consent: String
        public var givenName: String?
        public var familyName: String?
        /// A Managed Apple Account's organisation; nil for personal accounts.
        public var orgID: String?

        enum CodingKeys: String, CodingKey {
            case appleSub = "apple_sub"
            case teamID = "team_id"
            case clientID = "client_id"
            case email
            case emailVerified = "email_verified"
            case isPrivateEmail = "is_private_email"
            case consent
            case givenName = "given_name"
            case familyName = "family_name"
            case orgID = "org_id"
        }
    }

    public var userID: String
    public var status: String
    public var identities: [Identity]

    enum CodingKeys: String, CodingKey {
        case userID = "user_id"
        case status, identities
    }
}

/// Whether the user's Sign in with Apple authorization still holds.
public enum CredentialState: String, Sendable, Decodable {
    case authorized, revoked, transferred, deleted
    /// Still authorized at Apple, but the stored refresh token is dead (Apple's `invalid_grant`,
    /// e.g. after a password change): ask the user to sign in again.
    case tokenInvalid = "token_invalid"
    case notFound = "not_found"
}

struct CredentialStateAnswer: Decodable {
    var state: CredentialState
}

/// The body of `POST /v1/deletions`.
public struct DeletionRequest: Sendable, Encodable {
    public var userID: String?
    public var appleSub: String?
    /// Why, never who: it outlives the user.
    public var reason: String
    public var requestedBy: String
    /// A fresh authorization code from the app's deletion screen (lets the broker revoke
    /// when it holds no refresh token).
    public var authorizationCode: String?
    public var clientID: String?

    public init(userID: String, reason: String, requestedBy: String, authorizationCode: String? = nil, clientID: String? = nil) {
        self.userID = userID
        self.reason = reason
        self.requestedBy = requestedBy
        self.authorizationCode = authorizationCode
        self.clientID = clientID
    }

    enum CodingKeys: String, CodingKey {
        case userID = "user_id"
        case appleSub = "apple_sub"
        case reason
        case requestedBy = "requested_by"
        case authorizationCode = "authorization_code"
        case clientID = "client_id"
    }
}

/// 202 to a deletion request.
public struct DeletionAccepted: Sendable, Decodable {
    public var deletionID: String
    public var state: String
    /// false: a deletion was already open for this user (its id is returned).
    public var created: Bool

    enum CodingKeys: String, CodingKey {
        case deletionID = "deletion_id"
        case state, created
    }
}

/// A deletion's record.
public struct Deletion: Sendable, Decodable {
    public var deletionID: String
    public var userID: String
    /// `requested`, `revoking`, `purging`, `done`, `failed`.
    public var state: String
    /// Once decided: `revoked`, `already_invalid`, `skipped_apple_initiated` or `manual_required`
    /// (tell the user to stop using Sign in with Apple for the app in Settings).
    public var appleRevocation: String?

    enum CodingKeys: String, CodingKey {
        case deletionID = "deletion_id"
        case userID = "user_id"
        case state
        case appleRevocation = "apple_revocation"
    }
}

/// One page of the pull feed.
public struct EventPage: Sendable, Decodable {
    public struct Event: Sendable, Decodable {
        /// `evt_…`; webhook deliveries carry the same id.
        public var id: String
        public var type: String
        public var userID: String?
        public var createdAt: Date
        public var cursor: String

        enum CodingKeys: String, CodingKey {
            case id, type, cursor
            case userID = "user_id"
            case createdAt = "created_at"
        }
    }

    public var events: [Event]
    /// Where the next call starts: store it after handling the page.
    public var nextCursor: String

    enum CodingKeys: String, CodingKey {
        case events
        case nextCursor = "next_cursor"
    }
}
