import BrokerCore
import BrokerCrypto
import Foundation
import Observability
import PostgresClient
import StrictJSON

/// Resource servers that may introspect access tokens (RFC 7662; sql/0024
/// `oidc_resource_servers`): each has its own secret (stored as its SHA-256) and an audience,
/// the relying parties whose access tokens it accepts. Registrations and deletions are audited.
package struct ResourceServerStore: Sendable {
    let pool: PostgresPool

    package init(pool: PostgresPool) { self.pool = pool }

    package struct ResourceServer: Sendable {
        package let id: String
        package let name: String?
        /// The client ids whose access tokens it may introspect.
        package let clientIDs: [String]
        let secretHash: String
        package let createdAt: Date

        func accepts(secret: String) -> Bool {
            ConstantTime.equals(Array(SHA256.hexHash(secret).utf8), Array(secretHash.utf8))
        }

        package var json: JSONValue {
            var members: [String: JSONValue] = [
                "resource_server_id": .string(id), "client_ids": .array(clientIDs.map(JSONValue.string)),
                "created_at": .string(RFC3339.string(from: createdAt)),
            ]
            if let name { members["name"] = .string(name) }
            return .object(members)
        }
    }

    /// At most this many client ids in one audience.
    static let maximumClientIDs = 100

    /// Registers a resource server for `clientIDs` (each a registered client); returns it and its secret (shown once).
    /// - Throws: `BrokerError` `oidc_client_not_found` when a client id is not registered;
    ///   `OAuthError` invalid_client_metadata when the list is empty or long, or the name empty or long.
    package func create(name: String?, clientIDs: [String], actor: String) throws -> (ResourceServer, String) {
        let audience = Array(Set(clientIDs)).sorted()
        guard !audience.isEmpty, audience.count <= Self.maximumClientIDs else {
            throw OAuthError.invalidClientMetadata("client_ids: 1 to \(Self.maximumClientIDs) registered client ids")
        }
        // Characters (Unicode scalars), as the API description's maxLength counts them.
        if let name, name.isEmpty || name.unicodeScalars.count > 200 {
            throw OAuthError.invalidClientMetadata("name: 1 to 200 characters")
        }
        let id = "rs_" + Base64URL.encode(SecureRandom.bytes(16))
        let secret = Base64URL.encode(SecureRandom.bytes(32))
        let createdAt = try pool.withTransaction { connection in
            let known = try connection.query(
                "SELECT count(*) AS n FROM oidc_clients WHERE client_id = ANY(\(PostgresTextArray(audience)))"
            ).single().decode(Int.self, "n")
            // A reference to something that is not there, as a deletion's unknown user_id is.
            guard known == audience.count else {
                throw BrokerError(
                    .oidcClientNotFound,
                    "client_ids: every id must be a registered relying party (\(audience.count - known) of \(audience.count) are not)"
                )
            }
            let row = try connection.query(
                """
                INSERT INTO oidc_resource_servers (resource_server_id, secret_hash, name, client_ids, created_by)
                VALUES (\(id), \(SHA256.hexHash(secret)), \(name), \(PostgresTextArray(audience)), \(actor))
                RETURNING created_at
                """
            ).single()
            try AuditLog.record(
                connection, actor: actor, action: "oidc_resource_server.created",
                detail: ["target": .string(id), "outcome": .string("created"), "client_ids": .integer(Int64(audience.count))])
            return try row.decode(Date.self, "created_at")
        }
        return (
            ResourceServer(id: id, name: name, clientIDs: audience, secretHash: SHA256.hexHash(secret), createdAt: createdAt),
            secret
        )
    }

    private static let select = """
        SELECT resource_server_id, name, array_to_json(client_ids)::text AS client_ids, secret_hash, created_at
        FROM oidc_resource_servers
        """

    package func find(_ id: String) throws -> ResourceServer? {
        guard id.utf8.count <= 64, !id.utf8.contains(0) else { return nil }
        return try pool.query("\(unescaped: Self.select) WHERE resource_server_id = \(id)").first.map(Self.server)
    }

    package func list() throws -> [ResourceServer] {
        try pool.query("\(unescaped: Self.select) ORDER BY created_at").map(Self.server)
    }

    package func delete(_ id: String, actor: String) throws -> Bool {
        guard id.utf8.count <= 64, !id.utf8.contains(0) else { return false }
        return try pool.withTransaction { connection in
            guard
                !(try connection.query("DELETE FROM oidc_resource_servers WHERE resource_server_id = \(id) RETURNING 1").isEmpty)
            else { return false }
            try AuditLog.record(
                connection, actor: actor, action: "oidc_resource_server.deleted",
                detail: ["target": .string(id), "outcome": .string("deleted")])
            return true
        }
    }

    private static func server(_ row: PostgresRow) throws -> ResourceServer {
        ResourceServer(
            id: try row.decode(String.self, "resource_server_id"), name: try row.decode(String?.self, "name"),
            clientIDs: (try JSONValue.parse(Array(try row.decode(String.self, "client_ids").utf8)).arrayValue ?? [])
                .compactMap(\.stringValue),
            secretHash: try row.decode(String.self, "secret_hash"), createdAt: try row.decode(Date.self, "created_at"))
    }
}
