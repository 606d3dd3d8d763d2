import BrokerCrypto
import Foundation
import StrictJSON

/// What a web sign-in must remember between `authorize` and Apple's callback, carried in
/// the OAuth `state` itself, sealed (AES-256-GCM) with a key derived from
/// `TOKEN_ENCRYPTION_KEY`: authorize writes nothing, so calling it costs no row.
///
/// The text is `<key id>.<base64url(sealed JSON)>`; the key id lets states made before a
/// key rotation still open. Only the broker can make one, so a state that opens was made by
/// this broker for a registered client id and `return_to`; whether it was used already is
/// the store's business (`WebSignInStore.markUsed`).
struct WebSignInState: Sendable, Equatable {
    var clientID: String
    var returnTo: String
    var appState: String?
    /// The raw nonce; its hex SHA-256 goes to Apple and comes back inside the id_token.
    var rawNonce: String
    /// Unix seconds.
    var expiresAt: Int
    /// The hex SHA-256 of the secret in the `__Host-` cookie of the browser that started the
    /// sign-in; nil in states sealed by the release before it (accepted until they expire).
    var browser: String?

    static let purpose = "web-signin-state"
    /// Sealed states are at most about 1 KiB (512 bytes of `app_state`, a URL, a client id);
    /// anything longer is not one of ours and is refused before any work.
    static let maximumLength = 4096

    func sealed(with keys: TokenKeyRing) throws -> String {
        var members: [String: JSONValue] = [
            "c": .string(clientID), "r": .string(returnTo), "n": .string(rawNonce), "e": .integer(Int64(expiresAt)),
        ]
        if let appState { members["a"] = .string(appState) }
        if let browser { members["b"] = .string(browser) }
        let key = keys.derivedKey(Self.purpose)!
        let sealed = try AES256GCM.seal(
            JSONValue.object(members).serialized(), key: key, associatedData: Array(Self.purpose.utf8))
        return keys.currentKeyID + "." + Base64URL.encode(sealed)
    }

    /// The state `text` carries, or nil when it is not one this broker sealed (or was tampered with).
    static func open(_ text: String, keys: TokenKeyRing) -> WebSignInState? {
        guard text.utf8.count <= maximumLength, let dot = text.firstIndex(of: ".") else { return nil }
        guard let key = keys.derivedKey(purpose, keyID: String(text[..<dot])),
            let sealed = Base64URL.decode(text[text.index(after: dot)...]),
            let plain = try? AES256GCM.open(sealed, key: key, associatedData: Array(purpose.utf8)),
            case .object(let members)? = try? JSONValue.parse(plain),
            case .string(let clientID)? = members["c"], case .string(let returnTo)? = members["r"],
            case .string(let rawNonce)? = members["n"], case .integer(let expiresAt)? = members["e"]
        else { return nil }
        let appState: String? = if case .string(let value)? = members["a"] { value } else { nil }
        let browser: String? = if case .string(let value)? = members["b"] { value } else { nil }
        return WebSignInState(
            clientID: clientID, returnTo: returnTo, appState: appState, rawNonce: rawNonce, expiresAt: Int(expiresAt),
            browser: browser)
    }

    var isExpired: Bool { Int(Date().timeIntervalSince1970) >= expiresAt }
}
