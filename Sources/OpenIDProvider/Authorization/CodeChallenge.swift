import BrokerCrypto

/// PKCE (RFC 7636), S256 only (RFC 9700 §2.1.1: `plain` is refused).
enum CodeChallenge {
    /// RFC 7636 §4.1 and §4.2: a code verifier, and a challenge, are 43 to 128 characters of
    /// `[A-Z] / [a-z] / [0-9] / "-" / "." / "_" / "~"`.
    static func isWellFormed(_ value: String) -> Bool {
        (43...128).contains(value.utf8.count)
            && value.utf8.allSatisfy { byte in
                switch byte {
                case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                    UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                    UInt8(ascii: "~"):
                    true
                default: false
                }
            }
    }

    /// Whether `verifier` is the one `challenge` was made from (RFC 7636 §4.6, constant time).
    static func matches(verifier: String, challenge: String) -> Bool {
        ConstantTime.equals(Array(Base64URL.encode(SHA256.hash(verifier)).utf8), Array(challenge.utf8))
    }
}
