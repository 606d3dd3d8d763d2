import BrokerCrypto
import Foundation
import JOSE
import StrictJSON

/// What a verified Apple identity token says about the user.
public struct AppleIdentity: Sendable, Equatable {
    public var sub: String
    /// The audience that matched: the bundle ID or Services ID the token was issued to.
    public var clientID: String
    public var email: String?
    public var emailVerified: Bool?
    /// From the token; nil when absent (the caller treats absent as false when email is present).
    public var isPrivateEmail: Bool?
    /// nil when the token has none (web tokens).
    public var realUserStatus: RealUserStatus?
    public var transferSub: String?
    public var issuedAt: Date
    public var expiresAt: Date
    /// OIDC `c_hash`: base64url of the left half of SHA-256 of the authorization code issued
    /// with this token (most of Apple's native tokens carry it); nil when absent.
    public var codeHash: String? = nil
    /// `org_id` of a Managed Apple Account (Work & School): the organisation managing it. Such
    /// an account's address may be a real one (protocol reference §11.7); nil for others.
    public var orgID: String? = nil
    /// `auth_time`: when Apple last authenticated the person (modern tokens carry it; protocol
    /// reference §1). nil when absent, not a number, or later than the token itself.
    public var authTime: Date? = nil

    /// Whether `code` can be the code issued with this token: true when the token has no
    /// `c_hash` to compare with.
    public func matches(code: String) -> Bool {
        guard let codeHash else { return true }
        return ConstantTime.equals(Array(codeHash.utf8), Array(Base64URL.encode(SHA256.hash(code).prefix(16)).utf8))
    }
}

/// Checks an identity token against every rule of the protocol reference's checklist:
/// RS256 signature by Apple's key, `iss` exactly `https://appleid.apple.com` (whatever
/// `APPLE_BASE_URL` says), `aud` one of the configured client ids, `exp` with leeway, `iat`
/// not in the future and not older than `maximumAge`, `nbf` if present, the nonce rule,
/// a non-empty `sub`. Booleans may be JSON booleans or strings.
public struct IdentityTokenValidator: Sendable {
    public static let issuer = AppleClaims.issuer

    public let verifier: AppleTokenVerifier
    public let clientIDs: Set<String>
    public var leeway: TimeInterval = 60
    public var maximumAge: TimeInterval = 600
    public var now: @Sendable () -> Date = Date.init

    public init(verifier: AppleTokenVerifier, clientIDs: Set<String>, leeway: TimeInterval = 60, maximumAge: TimeInterval = 600) {
        self.verifier = verifier
        self.clientIDs = clientIDs
        self.leeway = leeway
        self.maximumAge = maximumAge
    }

    /// - Parameters:
    ///   - rawNonce: the nonce the app generated; the token's `nonce` must match it (`nonce(_:matches:)`).
    ///   - clientIDHint: when given, the audience must be this client id.
    ///   - checkAge: false for tokens Apple returns from `/auth/token` (their `iat` is now anyway).
    public func validate(_ token: String, rawNonce: String?, clientIDHint: String? = nil, checkAge: Bool = true) throws
        -> AppleIdentity
    {
        let current = now().timeIntervalSince1970
        let claims = try verifier.claims(of: token, leeway: leeway, now: current)
        try claims.checkIssuer()
        let clientID = try claims.audience { clientIDs.contains($0) && (clientIDHint == nil || $0 == clientIDHint) }
        // Both times present before either is judged: a token lacking one is malformed, expired or not.
        guard let expires = claims[.exp]?.integerValue else { throw TokenRejection.malformed("exp is missing") }
        guard let issuedAt = claims[.iat]?.integerValue else { throw TokenRejection.malformed("iat is missing") }
        try claims.check(expiry: expires, what: "the token")
        try claims.check(issuedAt: issuedAt)
        if let notBefore = claims[.nbf] {
            guard let value = notBefore.integerValue else { throw TokenRejection.malformed("nbf is not a number") }
            guard TimeInterval(value) - leeway <= current else { throw TokenRejection(.tokenNotYetValid, "nbf is in the future") }
        }
        if checkAge, current - TimeInterval(issuedAt) > maximumAge {
            throw TokenRejection(.tokenTooOld, "the token was issued more than \(Int(maximumAge)) s ago")
        }
        guard let sub = claims[.sub]?.stringValue, !sub.isEmpty else { throw TokenRejection.malformed("sub is missing") }

        if let rawNonce {
            switch claims[.nonce] {
            case .string(let nonce):
                guard Self.nonce(nonce, matches: rawNonce) else {
                    throw TokenRejection(
                        .nonceMismatch,
                        "nonce is neither the SHA-256 of raw_nonce (hex or base64) nor, unless it looks like a SHA-256, raw_nonce itself"
                    )
                }
            case nil:
                // Apple says nonce_supported=false means the platform could not carry one.
                guard claims[.nonceSupported]?.lenientBoolValue == false else {
                    throw TokenRejection(.nonceMissing, "the token carries no nonce")
                }
            default:
                throw TokenRejection.malformed("nonce is not a string")
            }
        }

        // Managed Apple Accounts (Work & School) send `email` empty (protocol reference §10.5):
        // no address, not an address "".
        let email = claims[.email]?.stringValue.flatMap { $0.isEmpty ? nil : $0 }
        let realUserStatus = claims[.realUserStatus]?.integerValue.flatMap(RealUserStatus.init(claim:))
        return AppleIdentity(
            sub: sub, clientID: clientID, email: email,
            emailVerified: claims[.emailVerified]?.lenientBoolValue,
            isPrivateEmail: claims[.isPrivateEmail]?.lenientBoolValue ?? (email == nil ? nil : false),
            realUserStatus: realUserStatus, transferSub: claims[.transferSub]?.stringValue,
            issuedAt: Date(timeIntervalSince1970: TimeInterval(issuedAt)),
            expiresAt: Date(timeIntervalSince1970: TimeInterval(expires)), codeHash: claims[.cHash]?.stringValue,
            orgID: claims[.orgID]?.stringValue.flatMap { $0.isEmpty || $0.utf8.count > 255 ? nil : $0 },
            authTime: claims[.authTime]?.integerValue.flatMap {
                $0 > issuedAt ? nil : Date(timeIntervalSince1970: TimeInterval($0))
            })
    }

    /// The nonce rule (protocol reference §1 "Nonce hashing"; issue 35): Apple hashes nothing
    /// and echoes what the app put in its request. What Apple's SDKs are given differs:
    /// Firebase, Supabase and Expo's guides put the lowercase hex SHA-256 of the raw nonce in
    /// the request (some apps the uppercase hex, or base64, firebase-ios-sdk #15571); web flows
    /// and Sign in with Apple JS often pass the nonce unhashed (better-auth PR #8870 accepts
    /// both). So the token's `nonce` matches `rawNonce` when it is the SHA-256 of `rawNonce` in
    /// hex (either case), base64 or base64url (padded or not), or `rawNonce` itself, except
    /// when it is shaped like a SHA-256 in one of those encodings: such a nonce must come
    /// with its preimage, or anyone holding the token could pass its nonce as `raw_nonce`.
    /// Every comparison is constant-time.
    public static func nonce(_ nonce: String, matches rawNonce: String) -> Bool {
        let digest = SHA256.hash(rawNonce)
        let hex = Hex.encode(digest)
        let base64url = Base64URL.encode(digest)
        let base64 = base64url.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        let claim = Array(nonce.utf8)
        var matched = false
        for candidate in [hex, hex.uppercased(), base64url, base64url + "=", base64, base64 + "="] {
            matched = ConstantTime.equals(claim, Array(candidate.utf8)) || matched
        }
        if matched { return true }
        return !looksLikeSHA256(nonce) && ConstantTime.equals(claim, Array(rawNonce.utf8))
    }

    /// Whether `nonce` has the shape of a SHA-256 digest: 64 hex digits, or 43 base64(url)
    /// characters (44 with `=`) that decode to 32 bytes.
    static func looksLikeSHA256(_ nonce: String) -> Bool {
        let bytes = Array(nonce.utf8)
        if bytes.count == 64, bytes.allSatisfy({ ($0 >= 48 && $0 <= 57) || (($0 | 0x20) >= 97 && ($0 | 0x20) <= 102) }) {
            return true
        }
        var text = nonce
        if text.utf8.count == 44, text.hasSuffix("=") { text.removeLast() }
        guard text.utf8.count == 43 else { return false }
        let urlSafe = text.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        return Base64URL.decode(urlSafe)?.count == 32
    }
}
