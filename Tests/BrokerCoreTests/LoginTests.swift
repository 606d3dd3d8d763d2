import AppleSimulator
import BrokerAPI
import BrokerCore
import BrokerCrypto
import Foundation
import HTTPClient
import JOSE
import Observability
import PostgresClient
import StrictJSON
import TestSupport
import Testing

/// `POST /v1/apple/login` end to end: HTTP into the broker, the broker over HTTP to the
/// Apple simulator, a real PostgreSQL underneath.
@Suite("Login", .offPool)
struct LoginTests {
    @Test("first login with name and relay e-mail creates the user; a repeat login finds it and keeps the name")
    func firstAndRepeatLogin() throws {
        let broker = try TestBroker()
        let minted = try broker.mint { $0.realUserStatus = 2 }
        let first = try broker.login([
            "identity_token": minted.idToken,
            "user": ["name": ["firstName": "Zoë", "lastName": "Doe", "middleName": "X"], "email": "ignored@example.com"],
        ])
        #expect(first.status == 200, "\(first.bodyText)")
        let body = first.json
        let userID = try #require(body["user_id"] as? String)
        #expect(body["apple_sub"] as? String == minted.sub)
        #expect(body["is_new_user"] as? Bool == true)
        #expect(body["email"] as? String == minted.email, "the verified token's e-mail wins over the unsigned user field")
        #expect(body["is_private_email"] as? Bool == true)
        #expect(body["email_verified"] as? Bool == true)
        #expect(body["real_user_status"] as? String == "likely_real")
        #expect(body["refresh_token_stored"] as? Bool == false)
        #expect(body["status"] as? String == "active")
        #expect((body["risk"] as? [String: Any])?["suggest_challenge"] as? Bool == false)

        let again = try broker.login(["identity_token": try broker.mint { $0.sub = minted.sub }.idToken])
        #expect(again.status == 200)
        #expect(again.json["user_id"] as? String == userID)
        #expect(again.json["is_new_user"] as? Bool == false)

        let user = try broker.get("/v1/users/\(userID)", key: broker.key([.read]))
        #expect(user.status == 200)
        let identity = try #require((user.json["identities"] as? [[String: Any]])?.first)
        #expect(identity["given_name"] as? String == "Zoë")
        #expect(identity["family_name"] as? String == "Doe")
        #expect(identity["client_id"] as? String == TestBroker.clientID)
        #expect(identity["consent"] as? String == "active")
        #expect(try broker.count("SELECT count(*) FROM users") == 1)
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'user.created'") == 1)
    }

    @Test(
        "a repeat login writes nothing within the last-login resolution; past it, only last_login_at and last_verified_at, with no event"
    )
    func repeatLoginWrites() throws {
        let broker = try TestBroker()
        let minted = try broker.mint()
        let first = try broker.login(["identity_token": minted.idToken])
        #expect(first.status == 200, "\(first.bodyText)")
        func identityRow() throws -> (version: String, lastLogin: Double, lastVerified: Double) {
            let row = try broker.pool.query(
                """
                SELECT xmin::text AS version, extract(epoch FROM last_login_at)::float8 AS last_login,
                       extract(epoch FROM last_verified_at)::float8 AS last_verified
                FROM apple_identities
                """
            ).single()
            return (
                try row.decode(String.self, "version"), try row.decode(Double.self, "last_login"),
                try row.decode(Double.self, "last_verified")
            )
        }
        let events = try broker.count("SELECT count(*) FROM outbox_events")
        let created = try identityRow()

        // Within the resolution (60 s by default): answered, the row untouched.
        let again = try broker.login(["identity_token": try broker.mint { $0.sub = minted.sub }.idToken])
        #expect(again.status == 200, "\(again.bodyText)")
        #expect(again.json["user_id"] as? String == first.json["user_id"] as? String)
        #expect(try identityRow().version == created.version, "a repeat login within the resolution wrote the identity")

        // Past it: the two times move to now, nothing else changes, no event is written.
        try broker.pool.query(
            "UPDATE apple_identities SET last_login_at = now() - interval '2 minutes', last_verified_at = now() - interval '2 minutes'"
        )
        let aged = try identityRow()
        let later = try broker.login(["identity_token": try broker.mint { $0.sub = minted.sub }.idToken])
        #expect(later.status == 200, "\(later.bodyText)")
        for field in ["user_id", "email", "email_verified", "is_private_email", "real_user_status", "refresh_token_stored"] {
            #expect("\(later.json[field] ?? "nil")" == "\(first.json[field] ?? "nil")", "\(field)")
        }
        #expect(later.json["is_new_user"] as? Bool == false)
        let touched = try identityRow()
        #expect(touched.lastLogin > aged.lastLogin + 100, "last_login_at was not rewritten past the resolution")
        #expect(touched.lastVerified > aged.lastVerified + 100, "last_verified_at was not rewritten past the resolution")
        #expect(try broker.count("SELECT count(*) FROM outbox_events") == events)

        // A change still goes through broker_login, stale or not: the token's e-mail (the
        // stored one made to differ) is kept again and announced.
        try broker.pool.query("UPDATE apple_identities SET email = 'old@privaterelay.appleid.com'")
        let changed = try broker.login(["identity_token": try broker.mint { $0.sub = minted.sub }.idToken])
        #expect(changed.status == 200, "\(changed.bodyText)")
        #expect(changed.json["email"] as? String == minted.email)
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'identity.updated'") == 1)
    }

    @Test(
        "a repeat login is one statement; a newer sign-in or a stale last_login_at one more, both written in it; a token from before a revocation is refused by the first"
    )
    func repeatLoginRoundTrips() throws {
        let broker = try TestBroker()  // the API alone: no worker shares the pool
        let now = Int(Date().timeIntervalSince1970)
        let minted = try broker.mint { $0.issuedAt = now - 120 }
        #expect(try broker.login(["identity_token": minted.idToken]).status == 200)
        // The pool counts a connection's statements when it comes back, which may be a moment after
        // the answer reached the client: count from and to a pool with every connection back.
        func settled() throws -> Int {
            waitUntil(seconds: 10) { broker.pool.statistics.open == broker.pool.statistics.idle }
            return broker.pool.statistics.statements
        }
        func statements(_ login: () throws -> HTTPClientResponse) throws -> (status: Int, code: String?, statements: Int) {
            // The API key is cached for 30 s, and a slow run (ThreadSanitizer on a busy machine)
            // can outlast that between two logins: the key's lookup would then count as the
            // login's. A rejected login (a malformed token: no statement of its own) renews it.
            #expect((400..<500).contains(try broker.login(["identity_token": "not-a-token"]).status))
            let before = try settled()
            let response = try login()
            return (response.status, response.json["code"] as? String, try settled() - before)
        }
        func signedInAt() throws -> Double {
            try broker.pool.query("SELECT extract(epoch FROM signed_in_at)::float8 AS t FROM apple_grants").single()
                .decode(Double.self, "t")
        }
        func login(issuedAt: Int) throws -> HTTPClientResponse {
            try broker.login([
                "identity_token": try broker.mint {
                    $0.sub = minted.sub
                    $0.issuedAt = issuedAt
                }.idToken
            ])
        }

        // The same sign-in again, within the last-login resolution: nothing to write. (last_login_at
        // set to now first, so a slow run, e.g. under ThreadSanitizer, does not pass the resolution.)
        try broker.pool.query("UPDATE apple_identities SET last_login_at = now()")
        let pipelined = broker.pool.statistics.pipelinedReads
        let again = try statements { try broker.login(["identity_token": minted.idToken]) }
        #expect(again.status == 200 && again.statements == 1, "\(again)")
        #expect(broker.pool.statistics.pipelinedReads == pipelined + 1, "the read went through the read pipeline")
        // A newer sign-in: on the timeline, in one more statement.
        let newer = try statements { try login(issuedAt: now - 60) }
        #expect(newer.status == 200 && newer.statements == 2, "\(newer)")
        #expect(try signedInAt() == Double(now - 60))
        // A newer sign-in past the resolution: both written by that one statement.
        try broker.pool.query("UPDATE apple_identities SET last_login_at = now() - interval '2 minutes'")
        let both = try statements { try login(issuedAt: now - 30) }
        #expect(both.status == 200 && both.statements == 2, "\(both)")
        #expect(try signedInAt() == Double(now - 30))
        #expect(try broker.count("SELECT count(*) FROM apple_identities WHERE last_login_at > now() - interval '1 minute'") == 1)

        // Revoked by Apple after that sign-in: a token from before the revocation is refused by
        // the first statement, and nothing is written.
        try broker.pool.query(
            "UPDATE apple_grants SET consent = 'revoked', consent_at = to_timestamp(\(Double(now - 20)))")
        let stale = try statements { try login(issuedAt: now - 25) }
        #expect(stale.status == 401 && stale.code == "token_too_old" && stale.statements == 1, "\(stale)")
        #expect(try signedInAt() == Double(now - 30))
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") == 1)
    }

    @Test("string booleans, a real address without is_private_email, and real_user_status map as documented")
    func claimVariants() throws {
        let broker = try TestBroker()
        let minted = try broker.mint {
            $0.email = "jane@example.com"
            $0.booleansAsStrings = true
            $0.realUserStatus = 1
        }
        let response = try broker.login(["identity_token": minted.idToken])
        #expect(response.status == 200)
        #expect(response.json["email"] as? String == "jane@example.com")
        #expect(response.json["email_verified"] as? Bool == true)
        #expect(response.json["is_private_email"] as? Bool == false)
        #expect(response.json["real_user_status"] as? String == "unknown")
        #expect((response.json["risk"] as? [String: Any])?["suggest_challenge"] as? Bool == true)

        let unsupported = try broker.login([
            "identity_token": try broker.mint {
                $0.realUserStatus = 0
                $0.omitEmail = true
            }.idToken
        ])
        #expect(unsupported.json["real_user_status"] as? String == "unsupported")
        #expect(unsupported.json["email"] is NSNull)
        #expect((unsupported.json["risk"] as? [String: Any])?["suggest_challenge"] as? Bool == false)

        // An Apple School Manager account (§10.5, §11.7): `email` empty, `email_verified` false,
        // an `org_id`. An empty address is no address: neither answered nor stored as one.
        let managed = try broker.mint { $0.schoolAccount = true }
        let work = try broker.login(["identity_token": managed.idToken])
        #expect(work.status == 200, "\(work.bodyText)")
        #expect(work.json["email"] is NSNull, "\(work.bodyText)")
        #expect(work.json["email_verified"] as? Bool == false)
        #expect(work.json["is_private_email"] as? Bool == false)
        #expect(try broker.count("SELECT count(*) FROM apple_identities WHERE email = ''") == 0)
        let again = try broker.login([
            "identity_token": try broker.mint {
                $0.sub = managed.sub
                $0.schoolAccount = true
            }.idToken
        ])
        #expect(again.status == 200 && again.json["is_new_user"] as? Bool == false)
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'identity.updated'") == 0)

        // A Managed Apple Account (Work & School) carries a real address (§11.7), shown as one.
        let work2 = try broker.login(["identity_token": try broker.mint { $0.managedAccount = true }.idToken])
        #expect((work2.json["email"] as? String)?.hasSuffix("@org.example") == true, "\(work2.bodyText)")
        #expect(work2.json["is_private_email"] as? Bool == false)
        // Relay addresses on Apple's newer domain are private too.
        let icloud = try broker.login(["identity_token": try broker.mint { $0.relayDomain = "private.icloud.com" }.idToken])
        #expect((icloud.json["email"] as? String)?.hasSuffix("@private.icloud.com") == true)
        #expect(icloud.json["is_private_email"] as? Bool == true)
    }

    @Test(
        "the nonce is raw_nonce's SHA-256 (hex, base64) or, unless shaped like one, raw_nonce itself; nonce_supported=false allows none"
    )
    func nonce() throws {
        let broker = try TestBroker()
        let good = try broker.mint { $0.rawNonce = "n-123" }
        #expect(try broker.login(["identity_token": good.idToken, "raw_nonce": "n-123"]).status == 200)

        let mismatch = try broker.login([
            "identity_token": try broker.mint { $0.rawNonce = "other" }.idToken, "raw_nonce": "n-123",
        ])
        #expect(mismatch.status == 401)
        #expect(mismatch.json["code"] as? String == "nonce_mismatch")
        // What Apple's SDKs are given (issue 35, protocol reference §1): the raw nonce unhashed
        // (web flows, Sign in with Apple JS), its SHA-256 as uppercase hex or base64.
        let digest = SHA256.hash("n-123")
        let base64url = Base64URL.encode(digest)
        let base64 = base64url.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/") + "="
        for claim in ["n-123", Hex.encode(digest).uppercased(), base64url, base64] {
            let accepted = try broker.login([
                "identity_token": try broker.mint { $0.nonceClaim = claim }.idToken, "raw_nonce": "n-123",
            ])
            #expect(accepted.status == 200, "nonce \(claim): \(accepted.bodyText)")
        }
        // A nonce shaped like a SHA-256 needs its preimage: whoever holds the token must not pass
        // the token's own nonce as raw_nonce.
        let hashed = Hex.encode(digest)
        let replayed = try broker.login([
            "identity_token": try broker.mint { $0.nonceClaim = hashed }.idToken, "raw_nonce": hashed,
        ])
        #expect(replayed.json["code"] as? String == "nonce_mismatch")

        let missing = try broker.login(["identity_token": try broker.mint().idToken, "raw_nonce": "n-123"])
        #expect(missing.json["code"] as? String == "nonce_missing")
        let unsupported = try broker.login([
            "identity_token": try broker.mint { $0.nonceSupported = false }.idToken, "raw_nonce": "n-123",
        ])
        #expect(unsupported.status == 200)
    }

    @Test("every token rejection has its own code, and nothing is written for a rejected login")
    func rejectionCodes() throws {
        let broker = try TestBroker()
        let now = Int(Date().timeIntervalSince1970)
        func code(_ token: String, _ extra: [String: Any] = [:]) throws -> String {
            let response = try broker.login(["identity_token": token].merging(extra) { $1 })
            return "\(response.status) \(response.json["code"] as? String ?? "-")"
        }
        let valid = try broker.mint().idToken
        var tampered = Array(valid)
        tampered[tampered.count - 5] = tampered[tampered.count - 5] == "A" ? "B" : "A"
        #expect(try code(String(tampered)) == "401 token_signature_invalid")
        #expect(try code("not-a-token") == "400 token_malformed")
        #expect(
            try code(
                try broker.mint {
                    $0.issuedAt = now - 7200
                    $0.lifetime = 600
                }.idToken) == "401 token_expired")
        #expect(try code(try broker.mint { $0.issuedAt = now + 3600 }.idToken) == "401 token_not_yet_valid")
        #expect(
            try code(
                try broker.mint {
                    $0.issuedAt = now - 1200
                    $0.lifetime = 86_400
                }.idToken) == "401 token_too_old")
        #expect(try code(try broker.mint { $0.issuer = "https://account.apple.com" }.idToken) == "401 token_issuer_invalid")
        #expect(
            try code(try broker.simulator.mintToken(TokenRequest(clientID: "com.attacker.app")).idToken)
                == "401 token_audience_invalid")
        #expect(try code(valid, ["client_id": TestBroker.webClientID]) == "401 token_audience_invalid")

        // Signed by a key that is not Apple's, under a kid Apple does not publish.
        let foreign = try AsymmetricKey.generateRSA()
        let payload = String(valid.split(separator: ".")[1])
        func forge(_ header: String, _ sign: (String) throws -> [UInt8]) throws -> String {
            let input: String = Base64URL.encode(header) + "." + payload
            return input + "." + Base64URL.encode(try sign(input))
        }
        #expect(
            try code(try forge(#"{"alg":"RS256","kid":"forged-kid"}"#) { try foreign.signSHA256(Array($0.utf8)) })
                == "401 unknown_key")
        // Signed by a foreign key under Apple's real kid.
        let appleKid = broker.simulator.currentKeyID
        let impostor = try forge("{\"alg\":\"RS256\",\"kid\":\"\(appleKid)\"}") { try foreign.signSHA256(Array($0.utf8)) }
        #expect(try code(impostor) == "401 token_signature_invalid")
        // alg none, and HS256 "signed" with Apple's public key.
        let noneToken = try forge("{\"alg\":\"none\",\"kid\":\"\(appleKid)\"}") { _ in [] }
        #expect(try code(noneToken) == "400 token_malformed")
        let appleKey = try #require(broker.simulator.keySet.verificationKey(keyID: appleKid))
        let publicPEM = Array(try appleKey.key.publicKeyPEM().utf8)
        let hs256 = try forge("{\"alg\":\"HS256\",\"kid\":\"\(appleKid)\"}") {
            HMACSHA256.authenticate(Array($0.utf8), key: publicPEM)
        }
        #expect(try code(hs256) == "400 token_malformed")

        // Bad request bodies.
        #expect(try broker.post("/v1/apple/login", json: "{", key: broker.loginKey()).json["code"] as? String == "invalid_json")
        #expect(
            try broker.post("/v1/apple/login", json: "{}", key: broker.loginKey()).json["code"] as? String == "invalid_request")
        #expect(try broker.post("/v1/apple/login", json: #"{"identity_token":""}"#, key: broker.loginKey()).status == 400)
        #expect(try broker.post("/v1/apple/login", json: #"{"identity_token":5}"#, key: broker.loginKey()).status == 400)
        #expect(try broker.login(["identity_token": valid], key: broker.key([.read])).status == 403)

        #expect(try broker.count("SELECT count(*) FROM users") == 0)
        #expect(try broker.count("SELECT count(*) FROM apple_identities") == 0)
        #expect(try broker.count("SELECT count(*) FROM outbox_events") == 0)
        let metrics = try broker.get("/metrics").bodyText
        #expect(metrics.contains(#"login_requests_total{outcome="token_expired"} 1"#))
        #expect(metrics.contains(#"login_requests_total{outcome="unknown_key"} 1"#))
    }

    @Test("a replayed token is refused once older than the maximum age")
    func replay() throws {
        let broker = try TestBroker(extra: ["APPLE_TOKEN_MAX_AGE_SECONDS": "2"])
        let token = try broker.mint().idToken
        #expect(try broker.login(["identity_token": token]).status == 200)
        Thread.sleep(forTimeInterval: 3.2)
        let replayed = try broker.login(["identity_token": token])
        #expect(replayed.status == 401)
        #expect(replayed.json["code"] as? String == "token_too_old")
    }

    @Test("the authorization code is exchanged once, its refresh token stored encrypted with its client id")
    func codeExchange() throws {
        let broker = try TestBroker()
        let minted = try broker.mint { $0.withCode = true }
        let code = try #require(minted.code)
        // The same login sent five times at once: one exchange at Apple, the same user for all.
        let results = onThreads(5) { _ in try broker.login(["identity_token": minted.idToken, "authorization_code": code]) }
        let responses = try results.map { try $0.get() }
        #expect(responses.allSatisfy { $0.status == 200 }, "\(responses.map(\.bodyText))")
        #expect(Set(responses.compactMap { $0.json["user_id"] as? String }).count == 1)
        #expect(responses.allSatisfy { $0.json["refresh_token_stored"] as? Bool == true })
        #expect(broker.simulator.statistics.token == 1)

        let row = try broker.pool.query("SELECT client_id, refresh_token, key_id FROM apple_tokens").single()
        #expect(try row.decode(String.self, 0) == TestBroker.clientID)
        let sealed = try row.decode([UInt8].self, 1)
        let ring = try TokenKeyRing(parsing: broker.environment["TOKEN_ENCRYPTION_KEY"]!)
        let plain = String(
            decoding: try ring.open(
                sealed, keyID: try row.decode(String.self, 2),
                associatedData: Array("apple_tokens|\(TestBroker.teamID)|\(minted.sub)|\(TestBroker.clientID)".utf8)),
            as: UTF8.self)
        #expect(broker.simulator.isTokenValid(plain), "the stored refresh token is the one Apple issued")
        #expect(!String(decoding: sealed, as: UTF8.self).contains(plain))
        // Never returned, never logged.
        let user = try broker.get("/v1/users/\(responses[0].json["user_id"]!)", key: broker.key([.read]))
        #expect(!user.bodyText.contains(plain))
        #expect(!broker.logs.capturedLines.contains { $0.contains(plain) || $0.contains(code) })

        // A repeat login (the one-statement fast path) reports the live token, and none once it
        // is revoked: its has_token reads the user's rows alone (LoginStore says why).
        let again = try broker.login(["identity_token": try broker.mint { $0.sub = minted.sub }.idToken])
        #expect(again.json["refresh_token_stored"] as? Bool == true, "\(again.bodyText)")
        try broker.pool.query("UPDATE apple_tokens SET revoked_at = now(), revoked_reason = 'token_invalid'")
        let afterRevocation = try broker.login(["identity_token": try broker.mint { $0.sub = minted.sub }.idToken])
        #expect(afterRevocation.status == 200, "\(afterRevocation.bodyText)")
        #expect(afterRevocation.json["refresh_token_stored"] as? Bool == false)
    }

    @Test("a bad or reused authorization code is 400 authorization_code_invalid and writes nothing")
    func badCode() throws {
        let broker = try TestBroker()
        let minted = try broker.mint()
        let bad = try broker.login(["identity_token": minted.idToken, "authorization_code": "c0ffee.0.sim.bogus"])
        #expect(bad.status == 400)
        #expect(bad.json["code"] as? String == "authorization_code_invalid")
        #expect(try broker.count("SELECT count(*) FROM users") == 0)
        // A code for another user than the token.
        let other = try broker.mint { $0.withCode = true }
        let mismatch = try broker.login(["identity_token": minted.idToken, "authorization_code": other.code!])
        #expect(mismatch.json["code"] as? String == "authorization_code_invalid")
    }

    @Test("Apple failing the exchange with 5xx is 503 apple_unavailable without sending the code again (it may be used up)")
    func appleDown() throws {
        let broker = try TestBroker(extra: ["APPLE_MAX_ATTEMPTS": "3"])
        let minted = try broker.mint { $0.withCode = true }
        broker.setFaults(on: ["token"]) {
            $0.errorRate = 1
            $0.errorStatuses = [503]
            $0.retryAfterSeconds = 0
        }
        let response = try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!])
        #expect(response.status == 503)
        #expect(response.json["code"] as? String == "apple_unavailable")
        #expect(response.header("retry-after") != nil)
        #expect(broker.simulator.statistics.token == 1, "a code goes to Apple once (protocol reference §11.4)")
        // Once Apple is back, the retried login succeeds with the same code, without a token.
        broker.simulator.faults = FaultSettings()
        let retried = try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!])
        #expect(retried.status == 200, "\(retried.bodyText)")
        #expect(retried.json["refresh_token_stored"] as? Bool == false)
        #expect(broker.simulator.statistics.token == 1)
    }

    @Test("Apple unreachable with no cached keys is 503; a rotated key is fetched once; unknown kids do not hammer Apple")
    func keys() throws {
        let offline = try TestBroker(appleBaseURL: "http://127.0.0.1:9")
        let unreachable = try offline.login(["identity_token": try offline.mint().idToken])
        #expect(unreachable.status == 503)
        #expect(unreachable.json["code"] as? String == "apple_unavailable")

        let broker = try TestBroker()
        #expect(try broker.login(["identity_token": try broker.mint().idToken]).status == 200)
        let fetchesBefore = broker.simulator.statistics.keys
        #expect(try broker.login(["identity_token": try broker.mint().idToken]).status == 200)
        #expect(broker.simulator.statistics.keys == fetchesBefore, "a cached key costs no fetch")

        try broker.simulator.rotateKeys()
        #expect(try broker.login(["identity_token": try broker.mint().idToken]).status == 200, "new kid: one refetch")
        #expect(broker.simulator.statistics.keys == fetchesBefore + 1)

        // Many tokens with unknown kids: at most one refetch per 10 s.
        let payload = String(try broker.mint().idToken.split(separator: ".")[1])
        let foreign = try AsymmetricKey.generateRSA()
        for index in 0..<20 {
            let input: String = Base64URL.encode("{\"alg\":\"RS256\",\"kid\":\"unknown-\(index)\"}") + "." + payload
            let token: String = input + "." + Base64URL.encode(try foreign.signSHA256(Array(input.utf8)))
            #expect(try broker.login(["identity_token": token]).json["code"] as? String == "unknown_key")
        }
        #expect(broker.simulator.statistics.keys <= fetchesBefore + 2)
    }

    @Test("ten concurrent first logins of one user create exactly one user")
    func concurrentFirstLogins() throws {
        let broker = try TestBroker()
        let sub = try broker.mint().sub
        let tokens = try (0..<10).map { _ in try broker.mint { $0.sub = sub }.idToken }
        let results = onThreads(10) { index in try broker.login(["identity_token": tokens[index]]) }
        let responses = try results.map { try $0.get() }
        #expect(responses.allSatisfy { $0.status == 200 })
        #expect(Set(responses.compactMap { $0.json["user_id"] as? String }).count == 1)
        #expect(responses.filter { $0.json["is_new_user"] as? Bool == true }.count == 1)
        #expect(try broker.count("SELECT count(*) FROM users") == 1)
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'user.created'") == 1)
    }

    @Test("a login while deletion is pending is 409; after the purge the same sub is a new user, and the audit says so")
    func deletionInteraction() throws {
        let broker = try TestBroker()
        let minted = try broker.mint()
        let first = try broker.login(["identity_token": minted.idToken])
        let userID = try #require(UUID(uuidString: first.json["user_id"] as! String))
        try broker.pool.query("UPDATE users SET status = 'deleting' WHERE id = \(userID)")
        let pending = try broker.login(["identity_token": try broker.mint { $0.sub = minted.sub }.idToken])
        #expect(pending.status == 409)
        #expect(pending.json["code"] as? String == "user_deletion_pending")
        // With a code: refused before the exchange, so no refresh token comes alive at Apple.
        let exchanges = broker.simulator.statistics.token
        let withCode = try broker.mint {
            $0.sub = minted.sub
            $0.withCode = true
        }
        let refused = try broker.login(["identity_token": withCode.idToken, "authorization_code": withCode.code!])
        #expect(refused.status == 409)
        #expect(refused.json["code"] as? String == "user_deletion_pending")
        #expect(broker.simulator.statistics.token == exchanges, "the code was not exchanged")

        // What the deletion job leaves behind: a tombstone, no user.
        try broker.pool.query(
            """
            INSERT INTO tombstones (deletion_id, team_id, sub_hash, user_id, reason, requested_by)
            VALUES (\(UUID()), \(TestBroker.teamID), \(broker.subjectHash(minted.sub)), \(userID), 'test', 'test')
            """)
        try broker.pool.query("DELETE FROM users WHERE id = \(userID)")
        let after = try broker.login(["identity_token": try broker.mint { $0.sub = minted.sub }.idToken])
        #expect(after.status == 200)
        #expect(after.json["is_new_user"] as? Bool == true)
        #expect(after.json["user_id"] as? String != userID.uuidString.lowercased())
        #expect(try broker.count("SELECT count(*) FROM audit_log WHERE action = 'login.new_user_after_deletion'") == 1)
        let state = try broker.get("/v1/users/\(userID)/credential-state", key: broker.key([.read]))
        #expect(state.json["state"] as? String == "deleted")
        #expect(try broker.get("/v1/users/\(userID)", key: broker.key([.read])).status == 410)
    }

    @Test("credential state: authorized, revoked, not_found; a sign-in after revocation re-activates")
    func credentialState() throws {
        let broker = try TestBroker()
        let minted = try broker.mint()
        let userID = try #require(try broker.login(["identity_token": minted.idToken]).json["user_id"] as? String)
        let read = try broker.key([.read])
        func state(_ id: String) throws -> String? {
            try broker.get("/v1/users/\(id)/credential-state", key: read).json["state"] as? String
        }
        #expect(try state(userID) == "authorized")
        try broker.pool.query(
            """
            SELECT broker_revoke_consent(id, \(TestBroker.clientID), '{com.example.app,com.example.web}', now(), 'test')
            FROM apple_identities WHERE user_id = \(UUID(uuidString: userID)!)
            """)
        #expect(try state(userID) == "revoked")
        #expect(try broker.login(["identity_token": try broker.mint { $0.sub = minted.sub }.idToken]).status == 200)
        #expect(try state(userID) == "authorized")
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'consent.restored'") == 1)
        #expect(try state(UUID().uuidString) == "not_found")
        #expect(try broker.get("/v1/users/not-a-uuid/credential-state", key: read).json["code"] as? String == "invalid_user_id")
    }

    @Test("a token carrying transfer_sub joins the user that owned the old sub")
    func transferSub() throws {
        let broker = try TestBroker()
        let old = try broker.mint()
        let userID = try #require(try broker.login(["identity_token": old.idToken]).json["user_id"] as? String)
        // What `transfer export` records: the transfer identifier of the old identity.
        try broker.pool.query("UPDATE apple_identities SET transfer_sub = 'T-123', team_id = 'OLDTEAM001'")
        let moved = try broker.login(["identity_token": try broker.mint { $0.transferSub = "T-123" }.idToken])
        #expect(moved.status == 200)
        #expect(moved.json["user_id"] as? String == userID)
        #expect(moved.json["is_new_user"] as? Bool == false)
        #expect(try broker.count("SELECT count(*) FROM apple_identities") == 2)
    }

    @Test(
        "the sweep turns Apple's revocation answer (invalid_request, TN3107's wording) into a consent revocation and a consent.revoked event"
    )
    func refreshSweep() throws {
        let broker = try TestBroker(roles: [.api, .sweep], extra: ["BROKER_SWEEP_INTERVAL_SECONDS": "1"])
        let kept = try broker.mint { $0.withCode = true }
        let revoked = try broker.mint { $0.withCode = true }
        for minted in [kept, revoked] {
            #expect(try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!]).status == 200)
        }
        // invalid_grant alone says only that the token is dead (RevocationPrecisionTests).
        var faults = FaultSettings()
        faults.revokedGrantError = "invalid_request"
        broker.simulator.faults = faults
        // The user stops using Sign in with Apple; Apple's notification never arrives.
        #expect(broker.simulator.revokeConsent(teamID: TestBroker.teamID, sub: revoked.sub) > 0)
        try broker.pool.query("UPDATE apple_tokens SET next_validation_at = now()")
        for _ in 0..<100
        where try broker.count("SELECT count(*) FROM apple_tokens WHERE last_validated_at IS NOT NULL") < 1
            || broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") < 1
        {
            Thread.sleep(forTimeInterval: 0.1)
        }
        #expect(try broker.count("SELECT count(*) FROM apple_grants WHERE consent = 'revoked'") == 1)
        #expect(try broker.count("SELECT count(*) FROM apple_tokens") == 1, "the dead token is deleted, the live one kept")
        #expect(
            try broker.count(
                "SELECT count(*) FROM apple_tokens WHERE last_validated_at IS NOT NULL AND next_validation_at > now() + interval '20 hours'"
            ) == 1)
        let event = try broker.pool.query("SELECT payload::text FROM outbox_events WHERE type = 'consent.revoked'").single()
        #expect(try event.decode(String.self, 0).contains("refresh_sweep"))
    }
}
