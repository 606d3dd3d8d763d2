import BrokerCrypto
import Foundation
import Glibc
import JOSE
import Locking
import Observability
import StrictJSON
import Synchronization

/// Mints the ES256 `client_secret` JWTs Apple requires (protocol reference §3):
/// header `alg` ES256 and `kid` = the key id; claims `iss` = team id, `sub` = the client id
/// the request is for, `aud` = `https://appleid.apple.com`, short `exp`.
///
/// Secrets are cached per client id and re-minted before they expire. The `.p8` file (and
/// the key id file, when `APPLE_KEY_ID_PATH` is used) are re-read when they change, so a
/// rotated key takes effect without a restart. A changed file that does not load (half
/// written, wrong kind of key, unreadable) keeps the last good key: every Apple call would
/// fail otherwise. That is logged once per change and counted
/// (`apple_key_reload_failures_total`).
public final class ClientSecretProvider: Sendable {
    public static let audience = "https://appleid.apple.com"

    private struct LoadedKey {
        var key: AsymmetricKey
        var keyID: String
        var keyModified: Date?
        var keyIDModified: Date?
        var checkedAt: Date
        /// The file stamps of a reload that failed (so it is reported once, not every 5 s).
        var failedStamps: [Date?]?
    }

    private let teamID: String
    private let keyPath: String
    private let keyIDPath: String?
    private let fixedKeyID: String
    private let lifetime: TimeInterval
    private let now: @Sendable () -> Date
    private let loaded = Lock<LoadedKey?>(nil)
    private let cache = Lock<[String: (secret: String, expires: Date, keyID: String)]>([:])
    private let mints: CounterFamily?
    private let reloadFailures: CounterFamily?
    private let logger: Logger?

    /// - Parameters:
    ///   - keyIDPath: a file holding the key id, re-read on change; nil uses `keyID`.
    ///   - lifetime: how long each secret is valid (Apple allows up to six months; short is safer).
    public init(
        teamID: String, keyID: String, keyPath: String, keyIDPath: String? = nil, lifetime: TimeInterval = 3600,
        metrics: MetricsRegistry? = nil, logger: Logger? = nil, now: @escaping @Sendable () -> Date = Date.init
    ) {
        self.logger = logger
        reloadFailures = metrics?.counter(
            "apple_key_reload_failures_total",
            help: "Changed .p8 (or key id) files that did not load; the last good key stays in use.", labels: [])
        self.teamID = teamID
        self.fixedKeyID = keyID
        self.keyPath = keyPath
        self.keyIDPath = keyIDPath
        self.lifetime = lifetime
        self.now = now
        mints = metrics?.counter(
            "apple_client_secret_mints_total", help: "Client secrets minted, by client id.", labels: ["client_id"])
    }

    /// A valid client secret for `clientID`.
    public func secret(for clientID: String) throws -> String {
        let key = try currentKey()
        let current = now()
        if let cached = cache.withLock({ $0[clientID] }), cached.keyID == key.keyID,
            cached.expires > current.addingTimeInterval(300)
        {
            return cached.secret
        }
        // Backdated a little for clock skew between us and Apple (protocol reference P8).
        let issuedAt = Int64(current.timeIntervalSince1970) - 30
        let expires = issuedAt + Int64(lifetime)
        let secret = try JWSSigner(key: key.key, keyID: key.keyID).sign(claims: [
            "iss": .string(teamID), "iat": .integer(issuedAt), "exp": .integer(expires),
            "aud": .string(Self.audience), "sub": .string(clientID),
        ])
        cache.withLock { $0[clientID] = (secret, Date(timeIntervalSince1970: TimeInterval(expires)), key.keyID) }
        mints?.increment(clientID)
        return secret
    }

    /// The signing key, reloaded when its file (or the key id file) changed; checked at most every 5 s.
    private func currentKey() throws -> LoadedKey {
        let current = now()
        if let loaded = loaded.withLock({ $0 }), current.timeIntervalSince(loaded.checkedAt) < 5 { return loaded }
        let keyModified = Self.modificationDate(keyPath)
        let keyIDModified = keyIDPath.flatMap(Self.modificationDate)
        if var existing = loaded.withLock({ $0 }), existing.keyModified == keyModified, existing.keyIDModified == keyIDModified {
            existing.checkedAt = current
            loaded.withLock { $0 = existing }
            return existing
        }
        let key: AsymmetricKey
        var keyID = fixedKeyID
        do {
            let pem = try String(contentsOfFile: keyPath, encoding: .utf8)
            key = try AsymmetricKey.privateKey(pem: pem)
            guard key.kind == .ecP256 else { throw CryptoError(.invalidKey, "the Apple key must be P-256") }
            if let keyIDPath {
                keyID = try String(contentsOfFile: keyIDPath, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
                guard !keyID.isEmpty else { throw CryptoError(.invalidKey, "the key id file is empty") }
            }
        } catch {
            guard var existing = loaded.withLock({ $0 }) else { throw error }
            let stamps = [keyModified, keyIDModified]
            if existing.failedStamps != stamps {
                reloadFailures?.increment()
                logger?.error(
                    "the changed Apple key file does not load; keeping the last good key",
                    [("path", keyPath), ("error", "\((error as? CryptoError)?.code.description ?? "unreadable")")])
            }
            existing.failedStamps = stamps
            existing.checkedAt = current
            loaded.withLock { $0 = existing }
            return existing
        }
        let fresh = LoadedKey(
            key: key, keyID: keyID, keyModified: keyModified, keyIDModified: keyIDModified, checkedAt: current, failedStamps: nil)
        loaded.withLock { $0 = fresh }
        cache.withLock { $0.removeAll() }
        return fresh
    }

    /// stat(2), which follows symlinks: Kubernetes updates a mounted Secret by swapping a link.
    private static func modificationDate(_ path: String) -> Date? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return Date(
            timeIntervalSince1970: TimeInterval(info.st_mtim.tv_sec) + TimeInterval(info.st_mtim.tv_nsec) / 1e9
                + TimeInterval(info.st_ino % 1000) * 1e-12)
    }
}
