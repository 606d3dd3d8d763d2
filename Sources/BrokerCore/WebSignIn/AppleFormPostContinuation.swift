/// Another sign-in that sends browsers to Apple with the web sign-in's Return URL (the
/// OpenID Provider does): Apple's form post comes back to `POST /v1/apple/web/callback`,
/// and the state's prefix says whose sign-in it finishes, so one Return URL registered at
/// Apple serves both. BrokerCore knows only this protocol, never who implements it.
package protocol AppleFormPostContinuation: Sendable {
    /// Every state this continuation seals starts with it; the web sign-in's states never do
    /// (they start with a key id and a '.').
    var statePrefix: String { get }
    /// Handles Apple's form post; answers where the browser goes next.
    func callback(form fields: [String: String]) throws -> String
}
