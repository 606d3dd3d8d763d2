import BrokerCrypto

/// The keyed hash that stands for an Apple `sub` wherever one must outlive the user or be
/// kept without the sub (tombstones, the notification inbox, the audit log, log lines).
///
/// Subs are known to the app's other systems, so an unkeyed SHA-256 of one is a lookup
/// away; this is HMAC-SHA256 under a key derived from each `TOKEN_ENCRYPTION_KEY` key
/// (`appleid-broker/subject-hash`), over `team_id|sub`, written `<key id>:<hex>`. New hashes
/// use the first key; lookups try every configured key, so a rotation keeps finding hashes
/// made before it while the old key stays configured.
package struct SubjectHasher: Sendable {
    private let keys: [(id: String, key: [UInt8])]

    static let purpose = "subject-hash"

    package init(keys ring: TokenKeyRing) {
        keys = ring.keyIDs.map { ($0, ring.derivedKey(Self.purpose, keyID: $0)!) }
    }

    /// The hash under the current key.
    package func hash(teamID: String, sub: String) -> String {
        Self.hash(teamID: teamID, sub: sub, key: keys[0])
    }

    /// The hash under every configured key, the current one first (for lookups).
    package func candidates(teamID: String, sub: String) -> [String] {
        keys.map { Self.hash(teamID: teamID, sub: sub, key: $0) }
    }

    private static func hash(teamID: String, sub: String, key: (id: String, key: [UInt8])) -> String {
        key.id + ":" + Hex.encode(HMACSHA256.authenticate(Array("\(teamID)|\(sub)".utf8), key: key.key))
    }
}
