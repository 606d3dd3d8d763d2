import Foundation
import StrictJSON

/// The claim rules Apple's identity tokens and server-to-server notifications share, over
/// the verified claims: `iss` exactly Apple's, an `aud` of ours, `iat` present and not in
/// the future, `exp` not past (each time with the leeway). Written once, so the two
/// cannot drift apart.
package struct AppleClaims {
    package static let issuer = "https://appleid.apple.com"

    package let claims: [String: JSONValue]
    package let leeway: TimeInterval
    package let now: TimeInterval

    package init(claims: [String: JSONValue], leeway: TimeInterval, now: TimeInterval) {
        self.claims = claims
        self.leeway = leeway
        self.now = now
    }

    package subscript(name: String) -> JSONValue? { claims[name] }

    /// `iss` must be `https://appleid.apple.com`, whatever `APPLE_BASE_URL` says.
    package func checkIssuer() throws {
        guard claims["iss"]?.stringValue == Self.issuer else {
            throw TokenRejection(.tokenIssuerInvalid, "iss must be \(Self.issuer)")
        }
    }

    /// The first audience `accepts` takes; `aud` may be a string or a list (RFC 7519 §4.1.3).
    package func audience(accepting accepts: (String) -> Bool) throws -> String {
        let audiences: [String]
        switch claims["aud"] {
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
        guard let issuedAt = claims["iat"]?.integerValue else { throw TokenRejection.malformed("iat is missing") }
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
        guard let value = claims["exp"] else {
            if required { throw TokenRejection.malformed("exp is missing") }
            return nil
        }
        guard let expires = value.integerValue else { throw TokenRejection.malformed("exp is not a number") }
        try check(expiry: expires, what: what)
        return expires
    }
}
