import AppleID
import Foundation
import JOSE
import StrictJSON
import TestSupport
import Testing

// Apple's rules in process: no database, no socket (`swift test --filter AppleIDTests`).

/// Apple's published keys, from a JWK Set held in memory.
private struct KeysInMemory: AppleKeyProvider {
    let set: JWKSet
    func key(id keyID: String) throws -> JWK {
        guard let key = set.verificationKey(keyID: keyID) else { throw AppleKeyError.unknownKey }
        return key
    }
}

@Suite("Identity-token rules", .enabled(if: TestData.shouldRun, Comment(rawValue: TestData.skipMessage)))
struct IdentityTokenRuleTests {
    @Test("the 26 Apple token cases get their recommended verdicts from the validator alone")
    func appleCases() throws {
        let file = try AppleTokenCases()
        let validator = IdentityTokenValidator(
            verifier: AppleTokenVerifier(keys: KeysInMemory(set: try JWKSet(json: Array(file.jwks)))),
            clientIDs: [file.audience], maximumAge: 10 * 365 * 86_400)
        let cases = try file.judged { token in
            do {
                _ = try validator.validate(token, rawNonce: nil)
                return nil
            } catch let rejection as TokenRejection {
                return rejection.code.rawValue
            }
        }
        #expect(cases.count == 26)
        #expect(cases.filter(\.isWrong).isEmpty, "\(cases.filter(\.isWrong).map { "\($0.name): \($0.verdict ?? "accepted")" })")
        // The documented choices for the policy cases, as the login API answers them.
        let policy = Dictionary(uniqueKeysWithValues: cases.filter { $0.expected == "policy" }.map { ($0.name, $0.verdict) })
        #expect(
            policy == [
                "valid_es256": "token_malformed", "duplicate_aud_last_is_right": "token_malformed",
                "signature_with_base64_padding": "token_malformed",
            ])
    }

    @Test("Apple's claim rules: iss exactly Apple's, aud one of ours (string or list), iat not ahead, exp not past")
    func claimRules() throws {
        func claims(_ members: [String: JSONValue]) -> AppleClaims { AppleClaims(claims: members, leeway: 60, now: 1_000_000) }
        func code(_ body: () throws -> Void) -> String? {
            do {
                try body()
                return nil
            } catch let rejection as TokenRejection {
                return rejection.code.rawValue
            } catch {
                return "\(error)"
            }
        }
        #expect(code { try claims(["iss": "https://appleid.apple.com"]).checkIssuer() } == nil)
        #expect(code { try claims(["iss": "https://appleid.apple.com/"]).checkIssuer() } == "token_issuer_invalid")
        #expect(code { try claims([:]).checkIssuer() } == "token_issuer_invalid")
        let ours: (String) -> Bool = { $0 == "a" }
        #expect(try claims(["aud": "a"]).audience(accepting: ours) == "a")
        #expect(try claims(["aud": .array(["b", "a"])]).audience(accepting: ours) == "a")
        #expect(code { _ = try claims(["aud": "b"]).audience(accepting: ours) } == "token_audience_invalid")
        #expect(code { _ = try claims([:]).audience(accepting: ours) } == "token_malformed")
        #expect(try claims(["iat": .integer(1_000_050)]).issuedAt() == 1_000_050)  // within the leeway
        #expect(code { _ = try claims(["iat": .integer(1_000_061)]).issuedAt() } == "token_not_yet_valid")
        #expect(code { _ = try claims([:]).issuedAt() } == "token_malformed")
        #expect(try claims(["exp": .integer(999_950)]).expiry(required: true, what: "t") == 999_950)
        #expect(code { _ = try claims(["exp": .integer(999_939)]).expiry(required: true, what: "t") } == "token_expired")
        #expect(code { _ = try claims([:]).expiry(required: true, what: "t") } == "token_malformed")
        #expect(try claims([:]).expiry(required: false, what: "t") == nil)
    }
}

/// The nonce rule (issue 35; protocol reference §1 "Nonce hashing"): what Apple's SDKs are given.
@Suite("Nonce rule")
struct NonceRuleTests {
    @Test("raw_nonce's SHA-256 in hex (either case), base64 or base64url, or the raw nonce when not shaped like a SHA-256")
    func accepted() {
        let raw = "6G_0cA0JElSPGVT1.vZJr9dSfenY1AZB"  // a Firebase-style raw nonce (firebase-ios-sdk #15571)
        let hex = "1e1a3ef4004127c7e591551020612e0ab2b02d9a954fbe62a5930affd45e377a"
        let base64 = "Hho+9ABBJ8flkVUQIGEuCrKwLZqVT75ipZMK/9ReN3o="
        for claim in [
            hex, hex.uppercased(), base64, String(base64.dropLast()), "Hho-9ABBJ8flkVUQIGEuCrKwLZqVT75ipZMK_9ReN3o", raw,
        ] {
            #expect(IdentityTokenValidator.nonce(claim, matches: raw), "\(claim)")
        }
        #expect(IdentityTokenValidator.nonce("c1a2-uuid-nonce", matches: "c1a2-uuid-nonce"), "web flows pass it unhashed")
    }

    @Test("anything else is a mismatch, and a nonce shaped like a SHA-256 needs its preimage")
    func refused() {
        let raw = "6G_0cA0JElSPGVT1.vZJr9dSfenY1AZB"
        let hex = "1e1a3ef4004127c7e591551020612e0ab2b02d9a954fbe62a5930affd45e377a"
        #expect(!IdentityTokenValidator.nonce(hex, matches: hex), "whoever holds the token knows its nonce")
        #expect(
            !IdentityTokenValidator.nonce(
                "Hho+9ABBJ8flkVUQIGEuCrKwLZqVT75ipZMK/9ReN3o=", matches: "Hho+9ABBJ8flkVUQIGEuCrKwLZqVT75ipZMK/9ReN3o="))
        #expect(!IdentityTokenValidator.nonce(String(hex.dropLast()) + "b", matches: raw))
        #expect(!IdentityTokenValidator.nonce(raw + " ", matches: raw))
        #expect(!IdentityTokenValidator.nonce("", matches: raw))
    }
}
