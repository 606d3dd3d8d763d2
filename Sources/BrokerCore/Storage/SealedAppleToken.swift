/// An Apple token at rest: AES-256-GCM under `TOKEN_ENCRYPTION_KEY`, its associated data
/// naming the kind, the identity (team, sub) and the client id it was issued for, so a
/// ciphertext moved to another row, or from one kind's column to the other's, does not open.
/// The login writes them; the sweep, the deletion job and `reencrypt` read them.
public struct SealedAppleToken: Sendable {
    /// Which token; the raw value starts its associated data (`reencrypt` builds the same in SQL).
    public enum Kind: String, Sendable {
        /// The refresh token of a code exchange, kept for the sweep and revocation.
        case refresh = "apple_tokens"
        /// The access token of a code exchange, kept until it expires: Apple's revoke takes it too (§10.3).
        case access = "apple_access_tokens"
    }

    /// Whose token it is.
    public struct Owner: Sendable {
        public var teamID: String
        public var sub: String
        public var clientID: String

        public init(teamID: String, sub: String, clientID: String) {
            self.teamID = teamID
            self.sub = sub
            self.clientID = clientID
        }
    }

    public let kind: Kind
    public let sealed: [UInt8]
    /// Which key of `TOKEN_ENCRYPTION_KEY` sealed it.
    public let keyID: String

    public init(_ kind: Kind, sealed: [UInt8], keyID: String) {
        self.kind = kind
        self.sealed = sealed
        self.keyID = keyID
    }

    /// Seals `token` for `owner` with the key ring's current key.
    public init(sealing token: String, as kind: Kind, for owner: Owner, keys: TokenKeyRing) throws {
        let (keyID, sealed) = try keys.seal(Array(token.utf8), associatedData: Self.associatedData(kind, owner))
        self.init(kind, sealed: sealed, keyID: keyID)
    }

    /// The token in clear; throws when the key is gone or the ciphertext is not `owner`'s.
    public func open(for owner: Owner, keys: TokenKeyRing) throws -> String {
        String(decoding: try keys.open(sealed, keyID: keyID, associatedData: Self.associatedData(kind, owner)), as: UTF8.self)
    }

    static func associatedData(_ kind: Kind, _ owner: Owner) -> [UInt8] {
        Array("\(kind.rawValue)|\(owner.teamID)|\(owner.sub)|\(owner.clientID)".utf8)
    }
}
