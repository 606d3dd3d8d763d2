import BrokerCrypto
import Foundation
import HTTPClient
import JOSE
import PostgresClient
import StrictJSON
import TestSupport
import Testing

@testable import OpenIDProvider

/// The authorization code flow end to end: a relying party (played over HTTP) → the provider
/// → the Apple simulator → Apple's form post → the RP's redirect_uri → token, userinfo,
/// refresh, revocation.
@Suite("OpenID Provider flow", .offPool)
struct ProviderFlowTests {
    static let rpState = "rp-state-42"
    static let nonce = "rp-nonce-7"

    func codeRequest(
        _ client: ProviderHarness.RegisteredClient, scope: String = "openid email profile offline_access", pkce: PKCE? = nil
    )
        -> [(String, String)]
    {
        var parameters = [
            ("response_type", "code"), ("client_id", client.id), ("redirect_uri", client.redirectURI), ("scope", scope),
            ("state", Self.rpState), ("nonce", Self.nonce),
        ]
        if let pkce { parameters += [("code_challenge", pkce.challenge), ("code_challenge_method", "S256")] }
        return parameters
    }

    @Test("discovery under the issuer's path, RFC 8414's well-known location, and a JWKS with Cache-Control")
    func discovery() throws {
        let harness = try ProviderHarness()
        for path in [
            "/oidc/.well-known/openid-configuration", "/oidc/.well-known/oauth-authorization-server",
            "/.well-known/oauth-authorization-server/oidc",
        ] {
            let response = try harness.send("GET", path)
            #expect(response.status == 200, "\(path)")
            let document = response.json
            #expect(document["issuer"] as? String == ProviderHarness.issuer)
            #expect(document["authorization_endpoint"] as? String == ProviderHarness.issuer + "/authorize")
            #expect(document["token_endpoint"] as? String == ProviderHarness.issuer + "/token")
            #expect(document["jwks_uri"] as? String == ProviderHarness.issuer + "/jwks")
            #expect(document["registration_endpoint"] as? String == ProviderHarness.issuer + "/register")
            #expect(document["code_challenge_methods_supported"] as? [String] == ["S256"])
            #expect(document["response_types_supported"] as? [String] == ["code"])
            #expect(document["subject_types_supported"] as? [String] == ["public"])
            #expect(document["authorization_response_iss_parameter_supported"] as? Bool == true)
            #expect(document["backchannel_logout_supported"] as? Bool == true)
            #expect(document["backchannel_logout_session_supported"] as? Bool == true)
            #expect(
                Set(document["token_endpoint_auth_methods_supported"] as? [String] ?? [])
                    == ["client_secret_basic", "client_secret_post", "private_key_jwt", "none"])
        }
        let jwks = try harness.send("GET", "/oidc/jwks")
        #expect(jwks.status == 200)
        #expect(jwks.header("cache-control")?.contains("max-age") == true)
        let set = try JWKSet(json: jwks.body)
        #expect(set.keys.count == 1, "the first key is made on first start")
        #expect(set.keys.first?.keyType == "RSA")
        #expect(try harness.count("SELECT count(*) FROM oidc_signing_keys WHERE private_key IS NOT NULL") == 1)
    }

    @Test("code flow: state and iss come back, the ID token verifies with every claim, userinfo answers by scope")
    func codeFlow() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let back = try harness.signIn(codeRequest(client), sim: [("sim_first_name", "Ada"), ("sim_last_name", "Lovelace")])
        #expect(back.base == client.redirectURI)
        #expect(back.query["state"] == Self.rpState)
        #expect(back.query["iss"] == ProviderHarness.issuer, "RFC 9207")
        let code = try #require(back.query["code"], "\(back.query)")

        let answer = try harness.token(
            [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)], as: client)
        #expect(answer.status == 200, "\(answer.bodyText)")
        #expect(answer.header("cache-control") == "no-store")
        let tokens = answer.json
        #expect(tokens["token_type"] as? String == "Bearer")
        #expect((tokens["expires_in"] as? Int ?? 0) > 0)
        let access = try #require(tokens["access_token"] as? String)
        #expect(tokens["refresh_token"] is String, "offline_access was granted")
        let claims = try harness.verifiedClaims(try #require(tokens["id_token"] as? String))
        #expect(claims["iss"]?.stringValue == ProviderHarness.issuer)
        #expect(claims["aud"]?.stringValue == client.id)
        #expect(claims["nonce"]?.stringValue == Self.nonce)
        #expect(claims["sid"]?.stringValue?.isEmpty == false)
        #expect(claims["auth_time"]?.integerValue != nil)
        #expect(claims["at_hash"]?.stringValue == Base64URL.encode(Array(SHA256.hash(access).prefix(16))))
        #expect(claims["email"]?.stringValue?.hasSuffix("@privaterelay.appleid.com") == true)
        #expect(claims["email_verified"]?.boolValue == true)
        #expect(claims["is_private_email"]?.boolValue == true)
        #expect(claims["name"]?.stringValue == "Ada Lovelace")
        #expect(claims["given_name"]?.stringValue == "Ada")
        let sub = try #require(claims["sub"]?.stringValue)
        #expect(try harness.count("SELECT count(*) FROM users WHERE id = \(UUID(uuidString: sub)!)") == 1, "sub is the user_id")
        #expect(
            try harness.count("SELECT count(*) FROM apple_tokens WHERE user_id = \(UUID(uuidString: sub)!)") == 1,
            "Apple's code was exchanged and its refresh token stored")

        for method in ["GET", "POST"] {
            let info = try harness.send(method, "/oidc/userinfo", headers: [("Authorization", "Bearer \(access)")])
            #expect(info.status == 200, "\(info.bodyText)")
            #expect(info.json["sub"] as? String == sub)
            #expect(info.json["family_name"] as? String == "Lovelace")
            #expect(info.json["email"] as? String == claims["email"]?.stringValue)
        }
        let inBody = try harness.send(
            "POST", "/oidc/userinfo", headers: [("Content-Type", "application/x-www-form-urlencoded")],
            body: FormEncoding.encode([("access_token", access)]))
        #expect(inBody.json["sub"] as? String == sub, "RFC 6750 §2.2")
        let missing = try harness.send("GET", "/oidc/userinfo")
        #expect(missing.status == 401)
        #expect(missing.header("www-authenticate") == "Bearer")
        let bad = try harness.send("GET", "/oidc/userinfo", headers: [("Authorization", "Bearer nope")])
        #expect(bad.status == 401)
        #expect(bad.header("www-authenticate")?.contains("error=\"invalid_token\"") == true)

        // A second sign-in of the same Apple user: same sub, the name kept from the first.
        let again = try harness.signIn(
            codeRequest(client, scope: "openid profile"), sim: [("sim_sub", try appleSub(harness, sub))])
        let second = try harness.token(
            [
                ("grant_type", "authorization_code"), ("code", try #require(again.query["code"])),
                ("redirect_uri", client.redirectURI),
            ],
            as: client)
        let secondClaims = try harness.verifiedClaims(try #require(second.json["id_token"] as? String))
        #expect(secondClaims["sub"]?.stringValue == sub)
        #expect(secondClaims["given_name"]?.stringValue == "Ada")
        #expect(secondClaims["email"] == nil, "no email scope, no email claim")
        #expect(second.json["refresh_token"] == nil, "no offline_access, no refresh token")

        // offline_access from a client without the refresh_token grant is ignored (Core §11), not refused.
        let noRefresh = try harness.confidentialClient(extra: ["grant_types": ["authorization_code"]])
        let third = try harness.signIn(codeRequest(noRefresh))
        let thirdTokens = try harness.token(
            [
                ("grant_type", "authorization_code"), ("code", try #require(third.query["code"], "\(third.query)")),
                ("redirect_uri", noRefresh.redirectURI),
            ], as: noRefresh)
        #expect(thirdTokens.json["refresh_token"] == nil)
        #expect(thirdTokens.json["scope"] as? String == "openid email profile")
    }

    func appleSub(_ harness: ProviderHarness, _ userID: String) throws -> String {
        try harness.pool.query("SELECT sub FROM apple_identities WHERE user_id = \(UUID(uuidString: userID)!)").single()
            .decode(String.self, "sub")
    }

    @Test("a replayed code is invalid_grant and revokes the tokens its first use gave")
    func codeReplay() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient(method: "client_secret_post")
        let code = try #require(try harness.signIn(codeRequest(client)).query["code"])
        let fields = [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)]
        let first = try harness.token(fields, as: client, basic: false)
        #expect(first.status == 200, "\(first.bodyText)")
        let access = try #require(first.json["access_token"] as? String)
        let refresh = try #require(first.json["refresh_token"] as? String)
        let replay = try harness.token(fields, as: client, basic: false)
        #expect(replay.status == 400)
        #expect(replay.json["error"] as? String == "invalid_grant")
        #expect(try harness.send("GET", "/oidc/userinfo", headers: [("Authorization", "Bearer \(access)")]).status == 401)
        let refreshed = try harness.token(
            [("grant_type", "refresh_token"), ("refresh_token", refresh)], as: client, basic: false)
        #expect(refreshed.json["error"] as? String == "invalid_grant", "\(refreshed.bodyText)")
    }

    @Test("one code sent eight times at once: exactly one answer has tokens, and the replays revoke them")
    func concurrentRedemption() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let code = try #require(try harness.signIn(codeRequest(client)).query["code"])
        let fields = [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)]
        let answers = try onThreads(8) { _ in try harness.token(fields, as: client) }.map { try $0.get() }
        let winners = answers.filter { $0.status == 200 }
        #expect(winners.count == 1, "\(answers.map(\.status))")
        #expect(answers.filter { $0.json["error"] as? String == "invalid_grant" }.count == 7)
        let access = try #require(winners.first?.json["access_token"] as? String)
        #expect(try harness.send("GET", "/oidc/userinfo", headers: [("Authorization", "Bearer \(access)")]).status == 401)
    }

    @Test("refresh tokens rotate; a reused one is invalid_grant and ends the grant")
    func refreshRotation() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let code = try #require(try harness.signIn(codeRequest(client)).query["code"])
        let first = try harness.token(
            [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)], as: client)
        let refresh1 = try #require(first.json["refresh_token"] as? String)
        let second = try harness.token([("grant_type", "refresh_token"), ("refresh_token", refresh1)], as: client)
        #expect(second.status == 200, "\(second.bodyText)")
        let refresh2 = try #require(second.json["refresh_token"] as? String)
        #expect(refresh2 != refresh1)
        let access2 = try #require(second.json["access_token"] as? String)
        let claims = try harness.verifiedClaims(try #require(second.json["id_token"] as? String))
        #expect(claims["nonce"] == nil, "a refreshed ID token carries no nonce")

        let reused = try harness.token([("grant_type", "refresh_token"), ("refresh_token", refresh1)], as: client)
        #expect(reused.status == 400)
        #expect(reused.json["error"] as? String == "invalid_grant")
        let afterReuse = try harness.token([("grant_type", "refresh_token"), ("refresh_token", refresh2)], as: client)
        #expect(afterReuse.json["error"] as? String == "invalid_grant", "the grant ended with the reuse")
        #expect(try harness.send("GET", "/oidc/userinfo", headers: [("Authorization", "Bearer \(access2)")]).status == 401)
        // Another client cannot use someone else's refresh token.
        let other = try harness.confidentialClient()
        let third = try harness.token(
            [
                ("grant_type", "authorization_code"),
                ("code", try #require(try harness.signIn(codeRequest(other)).query["code"])),
                ("redirect_uri", other.redirectURI),
            ], as: other)
        let stolen = try harness.token(
            [("grant_type", "refresh_token"), ("refresh_token", try #require(third.json["refresh_token"] as? String))], as: client
        )
        #expect(stolen.json["error"] as? String == "invalid_grant")
    }

    @Test(
        "a refresh sequence (OpenID Connect Core §12.2): each ID token keeps iss, sub, aud, auth_time and sid, with a later iat and no nonce; every access token works; a narrower scope narrows the access token alone (RFC 6749 §6)"
    )
    func refreshSequence() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let code = try #require(try harness.signIn(codeRequest(client)).query["code"])
        let first = try harness.token(
            [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)], as: client)
        let original = try harness.verifiedClaims(try #require(first.json["id_token"] as? String))
        var refresh = try #require(first.json["refresh_token"] as? String)
        var seen: Set<String> = [refresh]
        for _ in 0..<4 {
            let answer = try harness.token([("grant_type", "refresh_token"), ("refresh_token", refresh)], as: client)
            #expect(answer.status == 200, "\(answer.bodyText)")
            refresh = try #require(answer.json["refresh_token"] as? String)
            #expect(seen.insert(refresh).inserted, "a new refresh token each time")
            let claims = try harness.verifiedClaims(try #require(answer.json["id_token"] as? String))
            for name in ["iss", "sub", "aud", "auth_time", "sid"] {
                #expect(claims[name] != nil && claims[name] == original[name], "\(name): \(claims) vs \(original)")
            }
            #expect((claims["iat"]?.integerValue ?? 0) >= (original["iat"]?.integerValue ?? .max))
            #expect(claims["nonce"] == nil)
            let access = try #require(answer.json["access_token"] as? String)
            let info = try harness.send("GET", "/oidc/userinfo", headers: [("Authorization", "Bearer \(access)")])
            #expect(info.status == 200 && info.json["sub"] as? String == original["sub"]?.stringValue, "\(info.bodyText)")
        }
        // RFC 6749 §6: a scope the grant does not hold is invalid_scope.
        let wider = try harness.token(
            [("grant_type", "refresh_token"), ("refresh_token", refresh), ("scope", "openid email phone")], as: client)
        #expect(wider.json["error"] as? String == "invalid_scope", "\(wider.bodyText)")
        // A refused request spends nothing: the same refresh token still works, and the grant lives.
        let after = try harness.token([("grant_type", "refresh_token"), ("refresh_token", refresh)], as: client)
        #expect(after.status == 200, "\(after.bodyText)")

        // RFC 6749 §6: a narrower scope gives an access token of that scope only (userinfo and
        // the ID token leave out what was not asked for); the new refresh token keeps the grant's.
        let narrow = try harness.token(
            [
                ("grant_type", "refresh_token"), ("refresh_token", try #require(after.json["refresh_token"] as? String)),
                ("scope", "offline_access openid"),
            ], as: client)
        #expect(narrow.status == 200, "\(narrow.bodyText)")
        #expect(narrow.json["scope"] as? String == "openid offline_access", "\(narrow.bodyText)")
        let narrowClaims = try harness.verifiedClaims(try #require(narrow.json["id_token"] as? String))
        #expect(narrowClaims["email"] == nil && narrowClaims["name"] == nil, "\(narrowClaims)")
        let narrowAccess = try #require(narrow.json["access_token"] as? String)
        let narrowInfo = try harness.send("GET", "/oidc/userinfo", headers: [("Authorization", "Bearer \(narrowAccess)")])
        #expect(narrowInfo.status == 200 && narrowInfo.json["email"] == nil, "\(narrowInfo.bodyText)")
        #expect(narrowInfo.json["sub"] as? String == original["sub"]?.stringValue)
        let empty = try harness.token(
            [
                ("grant_type", "refresh_token"), ("refresh_token", try #require(narrow.json["refresh_token"] as? String)),
                ("scope", " "),
            ], as: client)
        #expect(empty.json["error"] as? String == "invalid_scope", "\(empty.bodyText)")
        let whole = try harness.token(
            [("grant_type", "refresh_token"), ("refresh_token", try #require(narrow.json["refresh_token"] as? String))],
            as: client)
        #expect(whole.json["scope"] as? String == "openid email profile offline_access", "\(whole.bodyText)")
        let wholeAccess = try #require(whole.json["access_token"] as? String)
        let wholeInfo = try harness.send("GET", "/oidc/userinfo", headers: [("Authorization", "Bearer \(wholeAccess)")])
        #expect(wholeInfo.json["email"] as? String != nil, "\(wholeInfo.bodyText)")
    }

    @Test("RFC 9700 §2.1.1: a code_verifier for a code issued without a code_challenge is invalid_grant (PKCE downgrade)")
    func pkceDowngrade() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let code = try #require(try harness.signIn(codeRequest(client)).query["code"])
        let downgraded = try harness.token(
            [
                ("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI),
                ("code_verifier", PKCE().verifier),
            ], as: client)
        #expect(downgraded.status == 400)
        #expect(downgraded.json["error"] as? String == "invalid_grant", "\(downgraded.bodyText)")
        // A confidential client that sent a challenge must send its verifier too.
        let pkce = PKCE()
        let bound = try #require(try harness.signIn(codeRequest(client, pkce: pkce)).query["code"])
        let without = try harness.token(
            [("grant_type", "authorization_code"), ("code", bound), ("redirect_uri", client.redirectURI)], as: client)
        #expect(without.json["error"] as? String == "invalid_grant", "\(without.bodyText)")
    }

    @Test("PKCE: public clients must send S256, plain is refused, a wrong verifier is invalid_grant; loopback on any port")
    func pkce() throws {
        let harness = try ProviderHarness()
        let native = try harness.publicClient()
        // No challenge from a public client: an error redirect, nothing stored.
        let missing = try ProviderHarness.Redirect(try harness.authorize(codeRequest(native)))
        #expect(missing.base == native.redirectURI)
        #expect(missing.query["error"] == "invalid_request")
        #expect(missing.query["state"] == Self.rpState)
        #expect(missing.query["iss"] == ProviderHarness.issuer)
        var plain = codeRequest(native)
        plain += [("code_challenge", String(repeating: "a", count: 43)), ("code_challenge_method", "plain")]
        #expect(try ProviderHarness.Redirect(try harness.authorize(plain)).query["error"] == "invalid_request")

        let pkce = PKCE()
        let code = try #require(try harness.signIn(codeRequest(native, pkce: pkce)).query["code"])
        let wrong = try harness.token(
            [
                ("grant_type", "authorization_code"), ("code", code), ("redirect_uri", native.redirectURI),
                ("code_verifier", PKCE().verifier),
            ], as: native)
        #expect(wrong.json["error"] as? String == "invalid_grant", "\(wrong.bodyText)")

        let code2 = try #require(try harness.signIn(codeRequest(native, pkce: pkce)).query["code"])
        let noVerifier = try harness.token(
            [("grant_type", "authorization_code"), ("code", code2), ("redirect_uri", native.redirectURI)], as: native)
        #expect(noVerifier.json["error"] as? String == "invalid_grant")

        let code3 = try #require(try harness.signIn(codeRequest(native, pkce: pkce)).query["code"])
        let right = try harness.token(
            [
                ("grant_type", "authorization_code"), ("code", code3), ("redirect_uri", native.redirectURI),
                ("code_verifier", pkce.verifier),
            ], as: native)
        #expect(right.status == 200, "\(right.bodyText)")

        // RFC 8252 §7.3: a loopback redirect registered without a port matches any port.
        let loopback = try harness.publicClient(redirectURI: "http://127.0.0.1/callback")
        var request = codeRequest(loopback, pkce: pkce)
        request = request.map { $0.0 == "redirect_uri" ? ($0.0, "http://127.0.0.1:53187/callback") : $0 }
        let back = try harness.signIn(request)
        #expect(back.base == "http://127.0.0.1:53187/callback")
        #expect(back.query["code"] != nil)
    }

    @Test(
        "an unknown client or unregistered redirect_uri gets a page, never a redirect; other errors redirect; nothing is stored")
    func authorizeRefusals() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let unknown = try harness.authorize([
            ("response_type", "code"), ("client_id", "oidc_nope"), ("redirect_uri", client.redirectURI),
        ])
        #expect(unknown.status == 400)
        #expect(unknown.header("location") == nil)
        #expect(unknown.header("content-type")?.hasPrefix("text/html") == true)
        for uri in [
            "https://rp.example.com/cb/", "https://rp.example.com/cb?x=1", "https://evil.example.com/cb",
            "https://rp.example.com/c",
        ] {
            let mismatch = try harness.authorize(codeRequest(client).map { $0.0 == "redirect_uri" ? ($0.0, uri) : $0 })
            #expect(mismatch.status == 400, "\(uri)")
            #expect(mismatch.header("location") == nil, "\(uri): no redirect to an unregistered URI")
        }
        func error(_ change: ([(String, String)]) -> [(String, String)]) throws -> String? {
            let redirect = try ProviderHarness.Redirect(try harness.authorize(change(codeRequest(client))))
            #expect(redirect.base == client.redirectURI)
            #expect(redirect.query["iss"] == ProviderHarness.issuer)
            return redirect.query["error"]
        }
        #expect(try error { $0.map { $0.0 == "response_type" ? ($0.0, "token") : $0 } } == "unsupported_response_type")
        #expect(try error { $0.map { $0.0 == "scope" ? ($0.0, "email") : $0 } } == "invalid_scope")
        #expect(try error { $0 + [("prompt", "none")] } == "login_required")
        #expect(try error { $0 + [("code_challenge", String(repeating: "b", count: 43))] } == "invalid_request")
        #expect(
            try harness.count(
                "SELECT (SELECT count(*) FROM oidc_grants) + (SELECT count(*) FROM oidc_codes) + (SELECT count(*) FROM web_used_states)"
            ) == 0)
    }

    @Test("the user cancels at Apple: access_denied with the RP's state and iss")
    func cancel() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let back = try harness.signIn(codeRequest(client), sim: [("sim_cancel", "1")])
        #expect(back.base == client.redirectURI)
        #expect(back.query["error"] == "access_denied")
        #expect(back.query["state"] == Self.rpState)
        #expect(back.query["iss"] == ProviderHarness.issuer)
        #expect(try harness.count("SELECT count(*) FROM oidc_grants") == 0)
    }

    @Test("token endpoint refusals: wrong secret, wrong method, redirect_uri mismatch, unknown grant type")
    func tokenRefusals() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let code = try #require(try harness.signIn(codeRequest(client)).query["code"])
        let fields = [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)]
        let wrong = ProviderHarness.RegisteredClient(id: client.id, secret: "not-the-secret", redirectURI: client.redirectURI)
        let refused = try harness.token(fields, as: wrong)
        #expect(refused.status == 401)
        #expect(refused.json["error"] as? String == "invalid_client")
        #expect(refused.header("www-authenticate")?.hasPrefix("Basic") == true)
        // Either secret method works for any confidential client (issue 36); a wrong secret in the body is refused too.
        #expect(try harness.token(fields, as: wrong, basic: false).json["error"] as? String == "invalid_client")
        #expect(try harness.token(fields, as: nil).json["error"] as? String == "invalid_client")
        #expect(try harness.token([("grant_type", "password")], as: client).json["error"] as? String == "unsupported_grant_type")
        let mismatch = try harness.token(
            [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", "https://rp.example.com/other")], as: client)
        #expect(mismatch.json["error"] as? String == "invalid_grant")
        // A code is bound to its client: another client's secret does not redeem it, and does
        // not spend it either (issue 36 item 9): the rightful client still can.
        let other = try harness.confidentialClient()
        let code2 = try #require(try harness.signIn(codeRequest(client)).query["code"])
        let code2Fields = [("grant_type", "authorization_code"), ("code", code2), ("redirect_uri", client.redirectURI)]
        let stolen = try harness.token(code2Fields, as: other)
        #expect(stolen.json["error"] as? String == "invalid_grant")
        let rightful = try harness.token(code2Fields, as: client)
        #expect(rightful.status == 200, "the code was not spent by another client's attempt: \(rightful.bodyText)")
        // An expired code (at most 60 s) is invalid_grant.
        let code3 = try #require(try harness.signIn(codeRequest(client)).query["code"])
        #expect(try harness.count("SELECT count(*) FROM oidc_codes WHERE expires_at <= now() + interval '60 seconds'") == 3)
        try harness.pool.query("UPDATE oidc_codes SET expires_at = now() - interval '1 second'")
        let expired = try harness.token(
            [("grant_type", "authorization_code"), ("code", code3), ("redirect_uri", client.redirectURI)], as: client)
        #expect(expired.json["error"] as? String == "invalid_grant")
        let metrics = try harness.send("GET", "/metrics").bodyText
        #expect(
            metrics.contains(#"oidc_token_requests_total{grant_type="authorization_code",outcome="invalid_client"}"#),
            "\(metrics)")
        #expect(metrics.contains(#"oidc_token_requests_total{grant_type="other",outcome="unsupported_grant_type"}"#))
        #expect(metrics.contains(#"http_request_duration_seconds_count{route="/oidc/token""#), "per-endpoint latency")
        let notForm = try harness.send("POST", "/oidc/token", headers: [("Content-Type", "application/json")], body: "{}")
        #expect(notForm.status == 400 || notForm.status == 401)
        #expect(notForm.json["error"] is String)
    }

    @Test("RFC 7009 revocation: a refresh token ends its grant, an access token stops at once")
    func revocation() throws {
        let harness = try ProviderHarness()
        let client = try harness.confidentialClient()
        let code = try #require(try harness.signIn(codeRequest(client)).query["code"])
        let tokens = try harness.token(
            [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", client.redirectURI)], as: client
        ).json
        let access = try #require(tokens["access_token"] as? String)
        let refresh = try #require(tokens["refresh_token"] as? String)
        func revoke(_ token: String) throws -> Int {
            let pair = client.id + ":" + client.secret!
            return try harness.send(
                "POST", "/oidc/revoke",
                headers: [
                    ("Content-Type", "application/x-www-form-urlencoded"),
                    ("Authorization", "Basic " + Data(pair.utf8).base64EncodedString()),
                ],
                body: FormEncoding.encode([("token", token)])
            ).status
        }
        #expect(try revoke(access) == 200)
        #expect(try harness.send("GET", "/oidc/userinfo", headers: [("Authorization", "Bearer \(access)")]).status == 401)
        #expect(try revoke(refresh) == 200)
        #expect(
            try harness.token([("grant_type", "refresh_token"), ("refresh_token", refresh)], as: client).json["error"] as? String
                == "invalid_grant")
        #expect(try revoke("unknown-token") == 200, "RFC 7009 §2.2: unknown tokens are answered 200")
    }
}

@Suite("OpenID Provider budgets", .offPool)
struct ProviderBudgetTests {
    @Test("refused token and userinfo requests are budgeted per address; a burst of them ends in 429")
    func failuresBudgeted() throws {
        let harness = try ProviderHarness(extra: ["BROKER_RATE_LIMIT_NOTIFICATIONS_PER_IP": "1"])
        var statuses: [Int] = []
        for _ in 0..<12 {
            statuses.append(try harness.send("GET", "/oidc/userinfo", headers: [("Authorization", "Bearer guessed")]).status)
        }
        #expect(statuses.prefix(5).allSatisfy { $0 == 401 }, "\(statuses)")
        #expect(statuses.last == 429, "\(statuses)")
        let token = try harness.token([("grant_type", "authorization_code"), ("code", "guessed")], as: nil)
        #expect(token.status == 429)
    }
}
