import AppleSimulator
import BrokerCore
import Foundation
import HTTPClient
import PostgresClient
import ProcessRunner
import TestSupport
import Testing

/// Issue 28, items 10–12: calls to Apple per user are bounded, a transfer login before the
/// import joins the sender's user, managed accounts keep their `org_id`. Each test fails on
/// the code before it.
@Suite("Revocation leftovers: bounds, transfers, managed accounts", .offPool)
struct RevocationLeftoverTests {
    // MARK: 10. code exchanges per user are bounded

    @Test(
        "a login key plus one user's valid tokens buys at most 10 code exchanges an hour: past them the verified sign-in goes on without one"
    )
    func codeExchangesPerUserBounded() throws {
        let broker = try TestBroker()
        let sub = try broker.mint().sub
        // The attack: fresh codes for one user, one login each (each token's c_hash matches).
        /// A login with a fresh code of this user's.
        func loginWithFreshCode(_ extra: [String: Any] = [:]) throws -> HTTPClientResponse {
            let minted = try broker.mint {
                $0.sub = sub
                $0.withCode = true
            }
            return try broker.login(
                ["identity_token": minted.idToken, "authorization_code": minted.code!].merging(extra) { $1 })
        }
        for attempt in 0..<10 {
            let login = try loginWithFreshCode()
            #expect(login.status == 200, "attempt \(attempt): \(login.bodyText)")
            #expect(login.json["code_exchange"] as? String == "exchanged")
        }
        let before = broker.simulator.statistics.token
        // Apple bounds nothing per user (protocol reference §12.5): a verified sign-in past the
        // budget is never refused; its code is not sent, and the answer says so. A first
        // authorization's name sent with it is kept.
        for attempt in 0..<5 {
            let signedIn = try loginWithFreshCode(["user": ["name": ["firstName": "Ada\(attempt)"]]])
            #expect(signedIn.status == 200, "\(signedIn.bodyText)")
            #expect(signedIn.json["code_exchange"] as? String == "over_budget")
            #expect(signedIn.json["refresh_token_stored"] as? Bool == true, "the stored token stays")
        }
        let identity = try broker.pool.query("SELECT given_name FROM apple_identities WHERE sub = \(sub)").single()
        #expect(try identity.decode(String?.self, "given_name") == "Ada4")
        #expect(try broker.get("/metrics").bodyText.contains(#"login_code_unsendable_total{outcome="over_budget"} 5"#))
        #expect(broker.simulator.statistics.token == before, "no call to Apple over the budget")
        #expect(try broker.count("SELECT count(*) FROM authorization_codes") == 10, "no ledger rows over the budget")
        // The ledger names the user by the keyed hash tombstones use, never the sub (rows outlive a purge by an hour).
        let keyed = try broker.subjectHash(sub)
        #expect(try broker.count("SELECT count(*) FROM authorization_codes WHERE subject_hash = \(keyed)") == 10)
        #expect(try broker.count("SELECT count(*) FROM apple_tokens") == 1, "one stored token per identity and client id")
        #expect(try broker.count("SELECT count(*) FROM users") == 1)
        // A login without a code is not an exchange: the user can still sign in.
        #expect(try broker.login(["identity_token": try broker.mint { $0.sub = sub }.idToken]).status == 200)
        // Another user is not affected.
        _ = try broker.signIn()
    }

    // MARK: 11. a transfer login before the import

    /// The recipient team's broker, on a database of its own: it knows the sender's users only
    /// by the transfer file.
    static let senderTeam = "OLDTEAM001"

    @Test("a login carrying a transfer_sub the import has not reached joins the sender's user id; the import then succeeds")
    func transferLoginBeforeImport() throws {
        let broker = try TestBroker(
            roles: [.api, .deletion], extra: ["BROKER_DELETION_RETRY_BASE_MS": "50", "BROKER_DELETION_INTERVAL_SECONDS": "1"])
        let oldUser = broker.simulator.createUser(teamID: Self.senderTeam)
        let transferSub = try broker.simulator.transferSub(teamID: Self.senderTeam, sub: oldUser.sub, to: TestBroker.teamID)
        let exportedUserID = UUID()
        let file = TestFiles.path("transfer", suffix: ".jsonl")
        defer { try? FileManager.default.removeItem(atPath: file) }
        let line = TeamTransfer.Line(userID: exportedUserID, transferSub: transferSub).json + "\n"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(line.utf8)))

        // The file arrives; the transfer completes in App Store Connect; the import is not run yet.
        let staged = try BrokerExecutable.run(
            ["transfer", "import", "--in", file, "--stage-only"], environment: broker.environment)
        #expect(staged.status == 0, "\(staged.stdout)\(staged.stderr)")
        #expect(staged.stdout.contains("staged: 1"), "\(staged.stdout)")
        #expect(broker.simulator.statistics.migration == 0, "staging asks Apple nothing")
        let newUser = try broker.simulator.recipient(ofTransfer: transferSub, teamID: TestBroker.teamID)
        let minted = try broker.mint {
            $0.sub = newUser.sub
            $0.withCode = true
        }
        let login = try broker.login(["identity_token": minted.idToken, "authorization_code": minted.code!])
        #expect(login.status == 200, "\(login.bodyText)")
        #expect(login.json["user_id"] as? String == exportedUserID.lowercasedString, "the sender's user id, not a new one")
        #expect(login.json["is_new_user"] as? Bool == false)
        #expect(login.json["refresh_token_stored"] as? Bool == true)
        #expect(try broker.count("SELECT count(*) FROM users") == 1)
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'user.created'") == 0)
        #expect(try broker.count("SELECT count(*) FROM outbox_events WHERE type = 'identity.linked'") == 1)

        // The import later finds the identity there: done, nothing failed, nobody duplicated.
        let imported = try BrokerExecutable.run(
            ["transfer", "import", "--in", file, "--rate", "0"], environment: broker.environment)
        #expect(imported.status == 0, "\(imported.stdout)\(imported.stderr)")
        #expect(imported.stdout.contains("already done before: 1"), "\(imported.stdout)")
        #expect(imported.stdout.contains("failed: 0"), "\(imported.stdout)")
        #expect(try broker.count("SELECT count(*) FROM users") == 1)
        #expect(try broker.count("SELECT count(*) FROM apple_identities WHERE user_id = \(exportedUserID)") == 1)
        // A repeat login stays on that user.
        let again = try broker.login(["identity_token": try broker.mint { $0.sub = newUser.sub }.idToken])
        #expect(again.json["user_id"] as? String == exportedUserID.lowercasedString)

        // The staged line names the user: the purge takes it with the rest.
        #expect(try broker.count("SELECT count(*) FROM transfer_staged") == 1)
        let deletion = try broker.post(
            "/v1/deletions", json: #"{"user_id":"\#(exportedUserID.lowercasedString)","reason":"r","requested_by":"q"}"#,
            key: broker.key([.compliance]))
        #expect(deletion.status == 202, "\(deletion.bodyText)")
        let deadline = Date().addingTimeInterval(30)
        while try broker.count("SELECT count(*) FROM deletion_requests WHERE state = 'done'") == 0, Date() < deadline {
            Thread.sleep(forTimeInterval: 0.05)
        }
        #expect(try broker.count("SELECT count(*) FROM users") == 0)
        #expect(try broker.count("SELECT count(*) FROM transfer_staged") == 0)
    }

    // MARK: 12. managed accounts

    @Test("a Managed Apple Account's org_id is kept and shown with the user; its real address is not a relay")
    func managedAccountOrgID() throws {
        let broker = try TestBroker()
        let minted = try broker.mint { $0.managedAccount = true }
        let orgID = try #require(broker.simulator.user(teamID: TestBroker.teamID, sub: minted.sub)?.orgID)
        let login = try broker.login(["identity_token": minted.idToken])
        #expect(login.status == 200, "\(login.bodyText)")
        let userID = try #require(login.json["user_id"] as? String)
        let identity = try #require(
            (try broker.get("/v1/users/\(userID)", key: broker.key([.read])).json["identities"] as? [[String: Any]])?.first)
        #expect(identity["org_id"] as? String == orgID)
        #expect((identity["email"] as? String)?.hasSuffix("@org.example") == true)
        #expect(identity["is_private_email"] as? Bool == false)
        // A repeat login (the fast path) keeps it; a personal account has none.
        #expect(try broker.login(["identity_token": try broker.mint { $0.sub = minted.sub }.idToken]).status == 200)
        #expect(try broker.count("SELECT count(*) FROM apple_identities WHERE org_id = \(orgID)") == 1)
        let personal = try broker.login(["identity_token": try broker.mint().idToken])
        let personalID = try #require(personal.json["user_id"] as? String)
        let other = (try broker.get("/v1/users/\(personalID)", key: broker.key([.read])).json["identities"] as? [[String: Any]])?
            .first
        #expect(other?["org_id"] == nil)
    }

    @Test("a re-authorization after a revocation keeps the user field's e-mail as well as its name")
    func reauthorizationKeepsUserFieldEmail() throws {
        let broker = try TestBroker(roles: [.api, .notifications])
        // Signed in a minute before the revocation (Apple's clock orders them, issue 35).
        let minted = try broker.mint { $0.issuedAt = Int(Date().timeIntervalSince1970) - 60 }
        let first = try broker.login(["identity_token": minted.idToken, "user": ["name": ["firstName": "Jane"]]])
        let userID = try #require(first.json["user_id"] as? String)
        var notification = NotificationRequest(
            url: broker.baseURL + "/v1/apple/notifications", type: "consent-revoked", sub: minted.sub,
            clientID: TestBroker.clientID)
        notification.eventTimeMilliseconds = Int64(Date().timeIntervalSince1970 - 5) * 1000
        #expect(try broker.simulator.sendNotification(notification).status == 200)
        // The first authorization again: Apple sends the user field once more, here only an e-mail.
        let again = try broker.login([
            "identity_token": try broker.mint { $0.sub = minted.sub }.idToken, "user": ["email": "jane@work.example"],
        ])
        #expect(again.status == 200, "\(again.bodyText)")
        #expect(again.json["unverified_email"] as? String == "jane@work.example", "\(again.bodyText)")
        let identity = (try broker.get("/v1/users/\(userID)", key: broker.key([.read])).json["identities"] as? [[String: Any]])?
            .first
        #expect(identity?["unverified_email"] as? String == "jane@work.example")
        #expect(identity?["email"] as? String == minted.email, "the verified address stays the token's")
        #expect(identity?["given_name"] as? String == "Jane")
        // The user field's presence is Apple's sign of a first authorization (issue 35): kept
        // whenever it comes, also while the broker thinks the consent active (a missed revocation).
        _ = try broker.login([
            "identity_token": try broker.mint { $0.sub = minted.sub }.idToken, "user": ["email": "jane@home.example"],
        ])
        let after = (try broker.get("/v1/users/\(userID)", key: broker.key([.read])).json["identities"] as? [[String: Any]])?
            .first
        #expect(after?["unverified_email"] as? String == "jane@home.example")
    }
}
