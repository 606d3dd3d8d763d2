import BrokerCrypto
import Foundation
import PostgresClient
import StrictJSON

/// Registered relying parties (sql/0017 `oidc_clients`); secrets stored as SHA-256 hashes.
package struct ClientStore: Sendable {
    let pool: PostgresPool

    package init(pool: PostgresPool) { self.pool = pool }

    /// A registered client.
    package struct Client: Sendable {
        package let clientID: String
        package let metadata: ClientMetadata
        let secretHash: String?
        package let createdAt: Date

        /// Whether `secret` is this client's (constant time).
        func accepts(secret: String) -> Bool {
            guard let secretHash else { return false }
            return ConstantTime.equals(Array(SHA256.hexHash(secret).utf8), Array(secretHash.utf8))
        }

        /// RFC 7591 §3.2.1 (without the secret, which is shown once).
        package var json: JSONValue {
            var members = metadata.json
            members["client_id"] = .string(clientID)
            members["client_id_issued_at"] = .integer(Int64(createdAt.timeIntervalSince1970))
            if secretHash != nil { members["client_secret_expires_at"] = .integer(0) }
            return .object(members)
        }
    }

    /// Registers a client; returns it and, for a confidential one, its secret (shown once).
    package func create(_ metadata: ClientMetadata, createdBy actor: String) throws -> (Client, String?) {
        let clientID = "oidc_" + Base64URL.encode(SecureRandom.bytes(16))
        let secret = metadata.isPublic ? nil : Base64URL.encode(SecureRandom.bytes(32))
        let row = try pool.query(
            """
            INSERT INTO oidc_clients (client_id, secret_hash, token_endpoint_auth_method, redirect_uris, grant_types,
                response_types, client_name, scope, backchannel_logout_uri, backchannel_logout_session_required, created_by,
                post_logout_redirect_uris)
            VALUES (\(clientID), \(secret.map { SHA256.hexHash($0) }), \(metadata.tokenEndpointAuthMethod),
                \(PostgresTextArray(metadata.redirectURIs)), \(PostgresTextArray(metadata.grantTypes)),
                \(PostgresTextArray(metadata.responseTypes)), \(metadata.clientName), \(metadata.scope),
                \(metadata.backchannelLogoutURI), \(metadata.backchannelLogoutSessionRequired), \(actor),
                \(PostgresTextArray(metadata.postLogoutRedirectURIs)))
            RETURNING created_at
            """
        ).single()
        return (
            Client(
                clientID: clientID, metadata: metadata, secretHash: secret.map { SHA256.hexHash($0) },
                createdAt: try row.decode(Date.self, "created_at")), secret
        )
    }

    private static let select = """
        SELECT client_id, secret_hash, token_endpoint_auth_method, array_to_json(redirect_uris)::text AS redirect_uris,
               array_to_json(grant_types)::text AS grant_types, array_to_json(response_types)::text AS response_types,
               client_name, scope, backchannel_logout_uri, backchannel_logout_session_required, created_at,
               array_to_json(post_logout_redirect_uris)::text AS post_logout_redirect_uris
        FROM oidc_clients
        """

    /// The client, or nil (ids longer than any we issue, or holding a NUL that no text column
    /// can bind, are not looked up).
    package func find(_ clientID: String) throws -> Client? {
        guard clientID.utf8.count <= 64, !clientID.utf8.contains(0) else { return nil }
        return try pool.query("\(unescaped: Self.select) WHERE client_id = \(clientID)").first.map(Self.client)
    }

    package func list() throws -> [Client] {
        try pool.query("\(unescaped: Self.select) ORDER BY created_at").map(Self.client)
    }

    /// Deletes the client with its grants, codes and tokens; false when unknown.
    package func delete(_ clientID: String) throws -> Bool {
        guard clientID.utf8.count <= 64, !clientID.utf8.contains(0) else { return false }
        return !(try pool.query("DELETE FROM oidc_clients WHERE client_id = \(clientID) RETURNING 1").isEmpty)
    }

    private static func client(_ row: PostgresRow) throws -> Client {
        func strings(_ column: String) throws -> [String] {
            (try JSONValue.parse(Array(try row.decode(String.self, column).utf8)).arrayValue ?? []).compactMap(\.stringValue)
        }
        // Stored rows were checked when registered; they are read back as they are.
        var metadata = ClientMetadata(
            stored: try strings("redirect_uris"),
            tokenEndpointAuthMethod: try row.decode(String.self, "token_endpoint_auth_method"),
            grantTypes: try strings("grant_types"), responseTypes: try strings("response_types"),
            clientName: try row.decode(String?.self, "client_name"), scope: try row.decode(String.self, "scope"),
            backchannelLogoutURI: try row.decode(String?.self, "backchannel_logout_uri"),
            backchannelLogoutSessionRequired: try row.decode(Bool.self, "backchannel_logout_session_required"))
        metadata.postLogoutRedirectURIs = try strings("post_logout_redirect_uris")
        return Client(
            clientID: try row.decode(String.self, "client_id"), metadata: metadata,
            secretHash: try row.decode(String?.self, "secret_hash"), createdAt: try row.decode(Date.self, "created_at"))
    }
}

extension ClientMetadata {
    /// Metadata as stored (checked when it was registered).
    init(
        stored redirectURIs: [String], tokenEndpointAuthMethod: String, grantTypes: [String], responseTypes: [String],
        clientName: String?, scope: String, backchannelLogoutURI: String?, backchannelLogoutSessionRequired: Bool
    ) {
        self.redirectURIs = redirectURIs
        self.tokenEndpointAuthMethod = tokenEndpointAuthMethod
        self.grantTypes = grantTypes
        self.responseTypes = responseTypes
        self.clientName = clientName
        self.scope = scope
        self.backchannelLogoutURI = backchannelLogoutURI
        self.backchannelLogoutSessionRequired = backchannelLogoutSessionRequired
    }
}
