import Foundation
import StrictJSON

/// The claims of a JWT Apple signed (identity token or server-to-server notification) and the
/// rules both share: `iss` exactly Apple's, an `aud` of ours, `iat` present and not in the
/// future, `exp` not past (each time with the leeway). Written once, so the two cannot drift
/// apart.
///
/// Only the claims the broker reads are kept, by `Name`; the payload is still parsed whole
/// and as strictly as any JSON here (duplicate names refused), but without building a
/// dictionary: that is what holds identity-token validation above 0.8 of `openssl speed`
/// (docs/benchmarks.md, "JWT validation").
package struct AppleClaims {
    package static let issuer = "https://appleid.apple.com"

    /// The claims the broker reads.
    package enum Name: Int, CaseIterable {
        case iss, aud, exp, iat, nbf, sub, nonce, nonceSupported, email, emailVerified, isPrivateEmail, realUserStatus
        case transferSub, jti, events, cHash, orgID, authTime

        /// The claim's name in the JWT.
        package var text: StaticString {
            switch self {
            case .iss: "iss"
            case .aud: "aud"
            case .exp: "exp"
            case .iat: "iat"
            case .nbf: "nbf"
            case .sub: "sub"
            case .nonce: "nonce"
            case .nonceSupported: "nonce_supported"
            case .email: "email"
            case .emailVerified: "email_verified"
            case .isPrivateEmail: "is_private_email"
            case .realUserStatus: "real_user_status"
            case .transferSub: "transfer_sub"
            case .jti: "jti"
            case .events: "events"
            case .cHash: "c_hash"
            case .orgID: "org_id"
            case .authTime: "auth_time"
            }
        }
    }

    private static let names = Name.allCases.map(\.text)

    /// By `Name.rawValue`; nil where the token has no such claim.
    private let values: [JSONValue?]
    package let leeway: TimeInterval
    package let now: TimeInterval

    /// Reads a verified JWT's payload.
    /// - Throws: `TokenRejection` (`token_malformed`) when it is not a strict JSON object.
    package init(payload: [UInt8], leeway: TimeInterval, now: TimeInterval) throws {
        do {
            values = try JSONValue.members(ofObject: payload, named: Self.names)
        } catch let error as JSONParseError {
            throw TokenRejection.malformed(error.reason)
        }
        self.leeway = leeway
        self.now = now
    }

    /// Claims already parsed (tests build them this way).
    package init(claims: [String: JSONValue], leeway: TimeInterval, now: TimeInterval) {
        values = Self.names.map { claims[$0.description] }
        self.leeway = leeway
        self.now = now
    }

    package subscript(name: Name) -> JSONValue? { values[name.rawValue] }

    /// `iss` must be `https://appleid.apple.com`, whatever `APPLE_BASE_URL` says.
    package func checkIssuer() throws {
        guard self[.iss]?.stringValue == Self.issuer else {
            throw TokenRejection(.tokenIssuerInvalid, "iss must be \(Self.issuer)")
        }
    }

    /// The first audience `accepts` takes; `aud` may be a string or a list (RFC 7519 §4.1.3).
    package func audience(accepting accepts: (String) -> Bool) throws -> String {
        let audiences: [String]
        switch self[.aud] {
        case .string(let value)?: audiences = [value]
        case .array(let values)?: audiences = values.compactMap(\.stringValue)
        default: throw TokenRejection.malformed("aud is missing")
        }
        guard let audience = audiences.first(where: accepts) else {
            throw TokenRejection(.tokenAudienceInvalid, "aud is not one of this service's client ids")
        }
        return audience
    }

    /// `iat`, required and not in the future.
    package func issuedAt() throws -> Int64 {
        guard let issuedAt = self[.iat]?.integerValue else { throw TokenRejection.malformed("iat is missing") }
        try check(issuedAt: issuedAt)
        return issuedAt
    }

    /// An `iat` already read: not in the future.
    package func check(issuedAt: Int64) throws {
        guard TimeInterval(issuedAt) - leeway <= now else { throw TokenRejection(.tokenNotYetValid, "iat is in the future") }
    }

    /// An `exp` already read: not past.
    package func check(expiry expires: Int64, what: String) throws {
        guard TimeInterval(expires) + leeway >= now else { throw TokenRejection(.tokenExpired, "\(what) has expired") }
    }

    /// `exp` not past; `required` for identity tokens, optional for notifications.
    /// - Returns: its value, nil when absent.
    @discardableResult
    package func expiry(required: Bool, what: String) throws -> Int64? {
        guard let value = self[.exp] else {
            if required { throw TokenRejection.malformed("exp is missing") }
            return nil
        }
        guard let expires = value.integerValue else { throw TokenRejection.malformed("exp is not a number") }
        try check(expiry: expires, what: what)
        return expires
    }
}
