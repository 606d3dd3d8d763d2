import AppleID
import BrokerAPI
import BrokerCore
import Foundation
import HTTPServer
import StrictJSON
import TestSupport
import Testing

/// The fuzz targets' seed corpora (Fuzz/Corpus), replayed through the same decoders in the
/// ordinary test run: a crash the fuzzer finds is added there as a file and stays fixed.
@Suite("Fuzz corpus regressions")
struct FuzzCorpusTests {
    static func corpus(_ target: String) throws -> [(name: String, bytes: [UInt8])] {
        let folder = Repository.root.appendingPathComponent("Fuzz/Corpus/\(target)")
        return try FileManager.default.contentsOfDirectory(atPath: folder.path).sorted().map { name in
            (name, Array(try Data(contentsOf: folder.appendingPathComponent(name))))
        }
    }

    static func notification(_ bytes: [UInt8]) throws -> AppleNotification {
        try NotificationReceiver.decode(
            claims: AppleClaims(payload: bytes, leeway: 60, now: 1_750_000_000),
            clientIDs: ["com.example.app", "com.example.web"])
    }

    @Test("notification claims: every seed decodes or is refused; events as a string or an object both read")
    func notifications() throws {
        let seeds = try Self.corpus("notification")
        #expect(seeds.count >= 5)
        var decoded: [String: AppleNotification] = [:]
        for seed in seeds {
            if let notification = try? Self.notification(seed.bytes) { decoded[seed.name] = notification }
        }
        #expect(decoded["events-as-string"]?.type == "email-disabled")
        #expect(decoded["events-as-object"]?.type == "account-delete")
        #expect(decoded["aud-array"]?.type == "email-enabled")
        #expect(decoded["no-jti"] == nil)
        // Milliseconds and seconds in event_time land on the same instant.
        #expect(decoded["events-as-string"]?.eventTime == decoded["events-as-object"]?.eventTime)
    }

    @Test("request bodies: every seed is read or refused with a problem, as the routes read them")
    func requestBodies() throws {
        let seeds = try Self.corpus("request-json")
        #expect(seeds.count >= 5)
        var accepted: Set<String> = []
        for seed in seeds {
            let request = HTTPRequest(
                method: .post, path: "/", headers: HTTPHeaders([("Content-Type", "application/json")]), body: seed.bytes)
            do {
                let body = try request.jsonObject()
                if let login = try? LoginRequest(body), (try? login.validate()) != nil { accepted.insert("login:" + seed.name) }
                if (try? DeletionService.Request(body)) != nil { accepted.insert("deletion:" + seed.name) }
                if let url = try? body.requiredString("url"), (try? WebhookSubscriptionStore.validate(url: url)) != nil {
                    accepted.insert("subscription:" + seed.name)
                }
            } catch let problem as Problem {
                #expect(problem.status == 400, "\(seed.name): \(problem.code)")
            }
        }
        #expect(
            accepted.isSuperset(of: [
                "login:login-token-only", "login:login-full", "login:login-user-as-string", "deletion:deletion-by-sub",
                "deletion:deletion-by-user", "subscription:subscription", "subscription:subscription-http-local",
            ]))
    }
}
