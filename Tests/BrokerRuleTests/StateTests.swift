import AppleID
import Deliveries
import Foundation
import PostgresClient
import StrictJSON
import TestSupport
import Testing

@testable import BrokerCore

// The fast layer: the typed states against the names SQL and the API description hold.

@Suite("Typed states")
struct StateTests {
    /// The raw values of every case, in declaration order.
    static func names<State: CaseIterable & RawRepresentable>(_ state: State.Type) -> [String] where State.RawValue == String {
        State.allCases.map(\.rawValue)
    }

    /// Every `CHECK (column IN ('a', 'b'))` of the migrations, by column (a column name can
    /// be in several tables: `state`, `status`).
    static func checks() throws -> [String: [Set<String>]] {
        let directory = Repository.root.appendingPathComponent("sql")
        let files = try #require(FileManager.default.enumerator(at: directory, includingPropertiesForKeys: nil))
            .compactMap { $0 as? URL }.filter { $0.pathExtension == "sql" }
        var found: [String: [Set<String>]] = [:]
        for file in files {
            let text = try String(contentsOf: file, encoding: .utf8)
            for match in text.matches(of: #/CHECK \((\w+) IN \(([^)]*)\)\)/#) {
                let values = match.output.2.split(separator: ",").map {
                    $0.trimmingCharacters(in: CharacterSet(charactersIn: " '"))
                }
                found[String(match.output.1), default: []].append(Set(values))
            }
        }
        return found
    }

    /// The `enum` at a path of docs/openapi.json.
    static func apiNames(_ path: [String]) throws -> [String] {
        var value = try JSONValue.parse(Array(try Repository.text("docs/openapi.json").utf8))
        for name in path { value = try #require(value.objectValue?[name], "\(path)") }
        return try #require(value.objectValue?["enum"]?.arrayValue).compactMap(\.stringValue)
    }

    @Test("each state's names are its SQL CHECK constraint's and the API description's")
    func namesMatch() throws {
        let checks = try Self.checks()
        func expectColumn(_ column: String, _ names: [String], sourceLocation: SourceLocation = #_sourceLocation) {
            #expect(checks[column]?.contains(Set(names)) == true, "\(column): \(names)", sourceLocation: sourceLocation)
        }
        expectColumn("status", Self.names(UserStatus.self))
        expectColumn("consent", Self.names(Consent.self))
        expectColumn("email_forwarding", Self.names(EmailForwarding.self))
        expectColumn("real_user_status", Self.names(RealUserStatus.self))
        expectColumn("status", Self.names(SubscriptionStatus.self))
        expectColumn("source", Self.names(DeletionSource.self))
        expectColumn("state", Self.names(DeletionState.self))
        expectColumn("apple_revocation", Self.names(AppleRevocation.self))
        expectColumn("revocation", Self.names(AppGroupRevocation.self))
        expectColumn("state", Self.names(DeliveryState.self))

        let schemas = ["components", "schemas"]
        #expect(try Self.apiNames(schemas + ["User", "properties", "status"]) == Self.names(UserStatus.self))
        #expect(try Self.apiNames(schemas + ["Consent"]) == Self.names(Consent.self))
        #expect(try Self.apiNames(schemas + ["EmailForwarding"]) == Self.names(EmailForwarding.self))
        #expect(try Self.apiNames(schemas + ["RealUserStatus"]) == Self.names(RealUserStatus.self))
        #expect(try Self.apiNames(schemas + ["Subscription", "properties", "status"]) == Self.names(SubscriptionStatus.self))
        #expect(try Self.apiNames(schemas + ["CredentialState", "properties", "state"]) == Self.names(CredentialState.self))
        #expect(try Self.apiNames(schemas + ["DeletionSource"]) == Self.names(DeletionSource.self))
        #expect(try Self.apiNames(schemas + ["DeletionState"]) == Self.names(DeletionState.self))
        #expect(try Self.apiNames(schemas + ["AppleRevocation"]) == Self.names(AppleRevocation.self))
        #expect(try Self.apiNames(schemas + ["AppGroupRevocation"]) == Self.names(AppGroupRevocation.self))
        #expect(try Self.apiNames(schemas + ["DeliveryState"]) == Self.names(DeliveryState.self))
        #expect(
            try Self.apiNames(schemas + ["NotificationResult", "properties", "status"])
                == ["applied", "duplicate", "stale", "unknown_subject", "unknown_type"])
    }

    @Test("a value outside a state fails to decode, and a state binds as its name")
    func decodeLoudly() throws {
        #expect(throws: PostgresError.self) { try UserStatus(postgresText: "suspended") }
        #expect(throws: PostgresError.self) { try Consent(postgresText: "Active") }
        #expect(throws: PostgresError.self) { try LoginOutcome(postgresText: "") }
        #expect(throws: PostgresError.self) { try DeletionStepOutcome(postgresText: "maybe") }
        #expect(try RealUserStatus(postgresText: "likely_real") == .likelyReal)
        #expect(try DeletionStep(postgresText: "revoke_access_token") == .revokeAccessToken)
        #expect(UserStatus.deleting.postgresBind == .text("deleting"))
        #expect(AppleRevocation.manualRequired.postgresBind == .text("manual_required"))
        #expect(Optional(RealUserStatus.unknown).map(\.postgresBind) == .text("unknown"))
    }

    @Test("Apple's real_user_status integers")
    func realUserStatusClaim() {
        #expect([0, 1, 2, 3, -1].map(RealUserStatus.init(claim:)) == [.unsupported, .unknown, .likelyReal, nil, nil])
    }
}
