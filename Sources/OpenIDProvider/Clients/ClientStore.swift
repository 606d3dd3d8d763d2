import BrokerCore
import BrokerCrypto
import Foundation
import PostgresClient
import StrictJSON

/// Registered relying parties (sql/0017 `oidc_clients`, sql/0024); secrets stored as SHA-256
/// hashes. Every registration and deletion is written to the audit log in its transaction.
package struct ClientStore: Sendable {
    let pool: PostgresPool

    package init(pool: PostgresPool) { self.pool = pool }

    /// A registered client.
    package struct Client: Sendable {
        package let clientID: String
        package let metadata: ClientMetadata
        let secretHash: String?
        package let createdAt: Date

        /// Whether `secret` is this client's (constant time). A private_key_jwt client has none.
        func accepts(secret: String) -> Bool {
            guard let secretHash, !metadata.usesPrivateKeyJWT else { return false }
            return ConstantTime.equals(Array(SHA256.hexHash(secret).utf8), Array(secretHash.utf8))
        }

        /// RFC 7591 §3.2.1 (without the secret, which is shown once).
        package var json: JSONValue {
            var members = metadata.json
            members["client_id"] = .string(clientID)
            members["client_id_issued_at"] = .integer(Int64(createdAt.timeIntervalSince1970))
            if secretHash != nil && !metadata.usesPrivateKeyJWT { members["client_secret_expires_at"] = .integer(0) }
            return .object(members)
        }
    }

    /// Registers a client; returns it and, for a client that authenticates with a secret, its
    /// secret (shown once). `actor` is who registered it (`api:<key id>`, `cli`), audited.
    package func create(_ metadata: ClientMetadata, createdBy actor: String) throws -> (Client, String?) {
        let clientID = "oidc_" + Base64URL.encode(SecureRandom.bytes(16))
        let secret = metadata.isPublic ? nil : Base64URL.encode(SecureRandom.bytes(32))
        // private_key_jwt: stored as client_secret_basic with a secret nobody is given, so the
        // previous release (which knows no private_key_jwt) refuses the client (sql/0024).
        let storedMethod = metadata.usesPrivateKeyJWT ? "client_secret_basic" : metadata.tokenEndpointAuthMethod
        let row = try pool.withTransaction { connection in
            let row = try connection.query(
                """
                INSERT INTO oidc_clients (client_id, secret_hash, token_endpoint_auth_method, redirect_uris, grant_types,
                    response_types, client_name, scope, backchannel_logout_uri, backchannel_logout_session_required, created_by,
                    jwks, jwks_uri, token_endpoint_auth_signing_alg, private_network_http_redirects, post_logout_redirect_uris)
                VALUES (\(clientID), \(secret.map { SHA256.hexHash($0) }), \(storedMethod),
                    \(PostgresTextArray(metadata.redirectURIs)), \(PostgresTextArray(metadata.grantTypes)),
                    \(PostgresTextArray(metadata.responseTypes)), \(metadata.clientName), \(metadata.scope),
                    \(metadata.backchannelLogoutURI), \(metadata.backchannelLogoutSessionRequired), \(actor),
                    \(metadata.jwks), \(metadata.jwksURI), \(metadata.signingAlgorithm), \(metadata.privateNetworkHTTPRedirects),
                    \(PostgresTextArray(metadata.postLogoutRedirectURIs)))
                RETURNING created_at
                """
            ).single()
            var detail: [String: JSONValue] = [
                "target": .string(clientID), "outcome": .string("created"),
                "token_endpoint_auth_method": .string(metadata.tokenEndpointAuthMethod),
            ]
            if metadata.privateNetworkHTTPRedirects { detail["private_network_http_redirects"] = .bool(true) }
            try AuditLog.record(connection, actor: actor, action: "oidc_client.created", detail: detail)
            return row
        }
        return (
            Client(
                clientID: clientID, metadata: metadata, secretHash: secret.map { SHA256.hexHash($0) },
                createdAt: try row.decode(Date.self, "created_at")), metadata.usesPrivateKeyJWT ? nil : secret
        )
    }

    private static let select = """
        SELECT client_id, secret_hash, token_endpoint_auth_method, array_to_json(redirect_uris)::text AS redirect_uris,
               array_to_json(grant_types)::text AS grant_types, array_to_json(response_types)::text AS response_types,
               client_name, scope, backchannel_logout_uri, backchannel_logout_session_required, created_at,
               jwks, jwks_uri, token_endpoint_auth_signing_alg, private_network_http_redirects,
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

    /// Every registered redirect URI (what CORS derives its origins from).
    func redirectURIs() throws -> [String] {
        try pool.query("SELECT DISTINCT unnest(redirect_uris) AS uri FROM oidc_clients").map { try $0.decode(String.self, "uri") }
    }

    /// Deletes the client with its grants, codes and tokens; false when unknown. Audited.
    package func delete(_ clientID: String, actor: String) throws -> Bool {
        guard clientID.utf8.count <= 64, !clientID.utf8.contains(0) else { return false }
        return try pool.withTransaction { connection in
            guard !(try connection.query("DELETE FROM oidc_clients WHERE client_id = \(clientID) RETURNING 1").isEmpty) else {
                return false
            }
            try AuditLog.record(
                connection, actor: actor, action: "oidc_client.deleted",
                detail: ["target": .string(clientID), "outcome": .string("deleted")])
            return true
        }
    }

    private static func client(_ row: PostgresRow) throws -> Client {
        func strings(_ column: String) throws -> [String] {
            (try JSONValue.parse(Array(try row.decode(String.self, column).utf8)).arrayValue ?? []).compactMap(\.stringValue)
        }
        let jwks = try row.decode(String?.self, "jwks")
        let jwksURI = try row.decode(String?.self, "jwks_uri")
        // Stored rows were checked when registered; they are read back as they are. Keys mean
        // private_key_jwt whatever the stored method says (sql/0024).
        var metadata = ClientMetadata(
            stored: try strings("redirect_uris"),
            tokenEndpointAuthMethod: jwks != nil || jwksURI != nil
                ? "private_key_jwt" : try row.decode(String.self, "token_endpoint_auth_method"),
            grantTypes: try strings("grant_types"), responseTypes: try strings("response_types"),
            clientName: try row.decode(String?.self, "client_name"), scope: try row.decode(String.self, "scope"),
            backchannelLogoutURI: try row.decode(String?.self, "backchannel_logout_uri"),
            backchannelLogoutSessionRequired: try row.decode(Bool.self, "backchannel_logout_session_required"))
        metadata.postLogoutRedirectURIs = try strings("post_logout_redirect_uris")
        metadata.jwks = jwks
        metadata.jwksURI = jwksURI
        metadata.signingAlgorithm = try row.decode(String?.self, "token_endpoint_auth_signing_alg")
        metadata.privateNetworkHTTPRedirects = try row.decode(Bool.self, "private_network_http_redirects")
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
