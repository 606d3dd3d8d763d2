import JOSE
import StrictJSON

/// An ID token this provider issued, given back as `id_token_hint` (OpenID Connect Core
/// §3.1.2.1; RP-Initiated Logout 1.0 §2): signed by one of our published keys, our `iss`,
/// a `sub`. Expiry is not checked: a relying party logging someone out, or asking whether
/// they are still signed in, typically holds an expired one (RP-Initiated Logout §4).
struct IDTokenHint: Sendable, Equatable {
    let sub: String
    let audiences: [String]
    let sid: String?

    /// Tokens longer than this were not issued here; they are not parsed.
    static let maximumBytes = 8192

    /// The hint `token` holds, or nil when this provider did not issue it.
    static func verify(_ token: String, keys: SigningKeys, issuer: String) -> IDTokenHint? {
        guard token.utf8.count <= maximumBytes, let claims = try? keys.verify(token),
            claims["iss"]?.stringValue == issuer, let sub = claims["sub"]?.stringValue, !sub.isEmpty,
            // A logout token is signed by the same keys; it is no ID token.
            claims["events"] == nil
        else { return nil }
        let audiences: [String]
        switch claims["aud"] {
        case .string(let audience)?: audiences = [audience]
        case .array(let values)?: audiences = values.compactMap(\.stringValue)
        default: return nil
        }
        guard !audiences.isEmpty else { return nil }
        return IDTokenHint(sub: sub, audiences: audiences, sid: claims["sid"]?.stringValue)
    }
}
