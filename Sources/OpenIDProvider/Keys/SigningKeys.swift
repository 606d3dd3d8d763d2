import BrokerCrypto
import Foundation
import JOSE
import Locking
import StrictJSON
import Synchronization

/// The keys in memory: the signer (the latest key whose activation has come) and the JWKS,
/// re-read from the database at most every `refreshSeconds`, so a rotation on another replica
/// or from the command line is seen within that time. Activation times are known ahead, so
/// a prepublished key starts signing on time between reloads.
package final class SigningKeys: Sendable {
    let store: SigningKeyStore
    let refreshSeconds: TimeInterval
    private struct Snapshot {
        var keys: [SigningKeyStore.Loaded] = []
        var jwks: [UInt8] = []
        var set = JWKSet(keys: [])
        var loadedAt = Date.distantPast
    }
    private let snapshot = Lock(Snapshot())

    package init(store: SigningKeyStore, refreshSeconds: TimeInterval = 30) {
        self.store = store
        self.refreshSeconds = refreshSeconds
    }

    private func current() throws -> Snapshot {
        let cached = snapshot.withLock { $0 }
        if Date().timeIntervalSince(cached.loadedAt) < refreshSeconds, !cached.keys.isEmpty { return cached }
        let keys = try store.publishable()
        let set = try keys.map { JSONValue.object(try JWK(key: $0.key, keyID: $0.kid).publicJSON()) }
        let jwks = JSONValue.object(["keys": .array(set)]).serialized()
        let fresh = Snapshot(keys: keys, jwks: jwks, set: try JWKSet(json: jwks), loadedAt: Date())
        snapshot.withLock { $0 = fresh }
        return fresh
    }

    /// Signs `claims` (RS256) with the key signing now.
    package func sign(_ claims: [String: JSONValue], type: String? = nil) throws -> String {
        let now = Date()
        guard let key = try current().keys.filter({ $0.activatesAt <= now }).max(by: { $0.activatesAt < $1.activatesAt })
        else { throw OAuthError("server_error", "no signing key is active", status: 503) }
        return try JWSSigner(key: key.key, keyID: key.kid).sign(
            claims: claims, extraHeader: type.map { ["typ": .string($0)] } ?? [:])
    }

    /// The claims of a token this provider signed with a key it still publishes (an ID token
    /// given back as `id_token_hint`): the signature only, RS256; the caller checks the claims.
    /// - Throws: `JOSEError` when the token is malformed or not signed by one of our keys.
    package func verify(_ token: String) throws -> [String: JSONValue] {
        try JWSVerifier(allowedAlgorithms: [.rs256]).verify(token, keys: try current().set).claims()
    }

    /// The JWK Set document.
    package func jwks() throws -> [UInt8] { try current().jwks }
}
