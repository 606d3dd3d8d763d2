import BrokerCore
import BrokerCrypto
import Foundation
import Observability
import PostgresClient
import TestSupport

/// A pool on a fresh database migrated to this release (a copy of the test process's
/// template), for the tests of one store or service: no broker, no HTTP, no simulator.
struct StoreFixture {
    let pool: PostgresPool
    let teamID = "TEAM000001"

    init() throws {
        pool = PostgresPool(
            configuration: .init(connection: try TestPostgres.freshDatabase(), maximumConnections: 4),
            logger: Logger(label: "store-test", sink: LogSink(level: .error)))
    }

    /// A user with one Apple identity; its ids.
    @discardableResult
    func user(
        sub: String = "001234.\(UUID().uuidString.prefix(8))", clientID: String = "com.example.app", email: String? = nil,
        givenName: String? = nil, lastLogin: Date? = nil, transferred: Bool = false, userID: UUID = UUID()
    ) throws -> (user: UUID, identity: UUID) {
        let identity = UUID()
        try pool.query("INSERT INTO users (id) VALUES (\(userID)) ON CONFLICT DO NOTHING")
        try pool.query(
            """
            INSERT INTO apple_identities (id, user_id, team_id, sub, client_id, email, email_verified, given_name,
                                          last_login_at, transferred_at)
            VALUES (\(identity), \(userID), \(teamID), \(sub), \(clientID), \(email), \(email != nil), \(givenName),
                    \(lastLogin), \(transferred ? Date() : nil))
            """)
        return (userID, identity)
    }

    func count(_ query: PostgresQuery) throws -> Int { try pool.query(query).single().decode(Int.self, 0) }

    static func keys() throws -> TokenKeyRing {
        try TokenKeyRing(parsing: "k1:" + Data(SecureRandom.bytes(32)).base64EncodedString())
    }
}
