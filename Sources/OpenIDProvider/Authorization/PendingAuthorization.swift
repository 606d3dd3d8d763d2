import BrokerCore
import BrokerCrypto
import Foundation
import StrictJSON

/// A relying party's authorization request, checked, carried to Apple and back inside the
/// `state` (sealed with a key derived from `TOKEN_ENCRYPTION_KEY`): the authorize endpoint
/// writes no row, so bad or abandoned requests cost nothing. Text: `oidc~<key id>.<sealed>`;
/// the prefix tells the web callback this sign-in is the provider's.
struct PendingAuthorization: Sendable, Equatable {
    var clientID: String
    var redirectURI: String
    var state: String?
    var nonce: String?
    var codeChallenge: String?
    var scope: String
    var responseMode: ResponseMode = .query
    /// The raw nonce whose hex SHA-256 went to Apple; Apple's identity token must carry it.
    var appleNonce: String
    /// Unix seconds.
    var expiresAt: Int
    /// The hex SHA-256 of the browser's binding secret (BrowserBinding); nil in states sealed
    /// by the previous release, which bound nothing.
    var browser: String? = nil

    static let prefix = "oidc~"
    static let purpose = "oidc-authorization-state"
    static let maximumLength = 8192

    var isExpired: Bool { Int(Date().timeIntervalSince1970) >= expiresAt }

    func sealed(with keys: TokenKeyRing) throws -> String {
        var members: [String: JSONValue] = [
            "c": .string(clientID), "r": .string(redirectURI), "o": .string(scope), "a": .string(appleNonce),
            "e": .integer(Int64(expiresAt)),
        ]
        if let state { members["s"] = .string(state) }
        if let nonce { members["n"] = .string(nonce) }
        if let codeChallenge { members["p"] = .string(codeChallenge) }
        if responseMode != .query { members["m"] = .string(responseMode.rawValue) }
        if let browser { members["b"] = .string(browser) }
        let sealed = try AES256GCM.seal(
            JSONValue.object(members).serialized(), key: keys.derivedKey(Self.purpose)!,
            associatedData: Array(Self.purpose.utf8))
        return Self.prefix + keys.currentKeyID + "." + Base64URL.encode(sealed)
    }

    /// The request `text` carries, or nil when this broker did not seal it.
    static func open(_ text: String, keys: TokenKeyRing) -> PendingAuthorization? {
        guard text.utf8.count <= maximumLength, text.hasPrefix(prefix) else { return nil }
        let body = text.dropFirst(prefix.count)
        guard let dot = body.firstIndex(of: "."), let key = keys.derivedKey(purpose, keyID: String(body[..<dot])),
            let sealed = Base64URL.decode(body[body.index(after: dot)...]),
            let plain = try? AES256GCM.open(sealed, key: key, associatedData: Array(purpose.utf8)),
            case .object(let members)? = try? JSONValue.parse(plain),
            let clientID = members["c"]?.stringValue, let redirectURI = members["r"]?.stringValue,
            let scope = members["o"]?.stringValue, let appleNonce = members["a"]?.stringValue,
            let expiresAt = members["e"]?.integerValue
        else { return nil }
        return PendingAuthorization(
            clientID: clientID, redirectURI: redirectURI, state: members["s"]?.stringValue, nonce: members["n"]?.stringValue,
            codeChallenge: members["p"]?.stringValue, scope: scope,
            responseMode: members["m"]?.stringValue.flatMap(ResponseMode.init(rawValue:)) ?? .query, appleNonce: appleNonce,
            expiresAt: Int(expiresAt), browser: members["b"]?.stringValue)
    }
}
