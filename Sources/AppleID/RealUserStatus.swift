/// How likely Apple thinks the user is a real person (the identity token's `real_user_status`,
/// an integer there; TN3159 and Apple's "Authenticating users with Sign in with Apple"):
/// native iOS 14+ tokens only, absent from web tokens. Raw values are the names the broker
/// stores and serves.
public enum RealUserStatus: String, Sendable, CaseIterable {
    case unsupported
    case unknown
    case likelyReal = "likely_real"

    /// The claim's integer: 0 unsupported, 1 unknown, 2 likely real; nil for any other value.
    public init?(claim: Int64) {
        switch claim {
        case 0: self = .unsupported
        case 1: self = .unknown
        case 2: self = .likelyReal
        default: return nil
        }
    }
}
