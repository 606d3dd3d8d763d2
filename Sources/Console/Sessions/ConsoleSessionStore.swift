import BrokerCore
import BrokerCrypto
import Foundation
import PostgresClient
import StrictJSON

/// A signed-in operator, as a request sees it.
public struct ConsoleSession: Sendable {
    /// The IdP's `sub`, or the name a sign-in link was made for.
    public var operatorID: String
    public var operatorName: String
    public var roles: Set<ConsoleRole>
    public var authTime: Date
    /// The cookie's value: the session's secret (never stored; the table holds its hash).
    var secret: String

    /// The form token of this session: derived from the secret, so a token from another
    /// session (or none) never matches, and nothing more is stored.
    public var csrfToken: String { Base64URL.encode(SHA256.hash("console-csrf|" + secret)) }
    /// `console:<operator>`, the actor of the audit log's rows.
    public var actor: String { "console:\(operatorID)" }

    func allows(_ roles: Set<ConsoleRole>) -> Bool { !self.roles.isDisjoint(with: roles) }
}

/// `console_sessions` and `console_links` (sql/0018_console.sql): sessions keyed by the
/// SHA-256 of the cookie, single-use sign-in links stored hashed, and the audit rows the
/// console writes (`console.*`, into the existing append-only `audit_log`).
public struct ConsoleSessionStore: Sendable {
    let pool: PostgresPool
    let idle: Duration
    let maximum: Duration
    let oidcTransactionLimit: Int
    /// The roles of a set of IdP groups under this process's role map (CONSOLE_OIDC_ROLE_MAP);
    /// nil without OpenID Connect. An OIDC session's roles are worked out with it on every
    /// request, so a changed map changes them at once (issue 38, item 6).
    let rolesOfGroups: (@Sendable ([String]) -> Set<ConsoleRole>)?

    public init(
        pool: PostgresPool, idle: Duration = .seconds(1800), maximum: Duration = .seconds(8 * 3600),
        oidcTransactionLimit: Int = 10_000, rolesOfGroups: (@Sendable ([String]) -> Set<ConsoleRole>)? = nil
    ) {
        self.pool = pool
        self.idle = idle
        self.maximum = maximum
        self.oidcTransactionLimit = oidcTransactionLimit
        self.rolesOfGroups = rolesOfGroups
    }

    static func hash(_ secret: String) -> [UInt8] { SHA256.hash(secret) }

    /// A new random secret: 32 bytes, base64url.
    static func newSecret() -> String { Base64URL.encode(SecureRandom.bytes(32)) }

    /// Opens a session; returns it with its secret (the cookie's value).
    /// - Parameter groups: an OIDC sign-in's mapped groups (its roles follow them); nil: a
    ///   sign-in link's session, whose role is the link's.
    func open(operatorID: String, name: String, roles: Set<ConsoleRole>, groups: [String]? = nil, authTime: Date) throws
        -> ConsoleSession
    {
        let secret = Self.newSecret()
        let roleNames = PostgresTextArray(roles.sorted().map(\.rawValue))
        try pool.query(
            """
            INSERT INTO console_sessions (id_hash, operator, operator_name, roles, groups, auth_time, expires_at)
            VALUES (\(Self.hash(secret)), \(operatorID), \(name), \(roleNames), \(groups.map(PostgresTextArray.init)),
                    \(authTime), now() + \(maximum)::interval)
            """)
        return ConsoleSession(operatorID: operatorID, operatorName: name, roles: roles, authTime: authTime, secret: secret)
    }

    /// The live session of this cookie value, its last-seen time moved on; nil when unknown,
    /// ended, past its maximum age or idle too long. An OIDC session's roles are its groups'
    /// under the current role map, read now: one whose groups map to no role any more (or
    /// whose process has no identity provider) ends here.
    func session(secret: String) throws -> ConsoleSession? {
        guard secret.utf8.count <= 64,
            let row = try pool.query(
                """
                UPDATE console_sessions SET last_seen_at = now()
                WHERE id_hash = \(Self.hash(secret)) AND ended_at IS NULL AND expires_at > now()
                  AND last_seen_at > now() - \(idle)::interval
                RETURNING operator, operator_name, array_to_string(roles, ',') AS roles, auth_time,
                          array_to_json(groups)::text AS groups
                """
            ).first
        else { return nil }
        var roles = Set(
            try row.decode(String.self, "roles").split(separator: ",").compactMap { ConsoleRole(rawValue: String($0)) })
        if let text = try row.decode(String?.self, "groups") {
            let groups = (try? JSONValue.parse(Array(text.utf8)))?.arrayValue?.compactMap(\.stringValue) ?? []
            roles = rolesOfGroups?(groups) ?? []
            if roles.isEmpty {
                try end(secret: secret)
                return nil
            }
        }
        return ConsoleSession(
            operatorID: try row.decode(String.self, "operator"), operatorName: try row.decode(String.self, "operator_name"),
            roles: roles, authTime: try row.decode(Date.self, "auth_time"), secret: secret)
    }

    /// What the identity provider says of an operator now, for every live OIDC session of
    /// theirs: a sign-in with other groups moves their other sessions to them (a group removed
    /// at the provider takes effect in every browser at the operator's next sign-in).
    func follow(operatorID: String, groups: [String], roles: Set<ConsoleRole>) throws {
        try pool.query(
            """
            UPDATE console_sessions SET groups = \(PostgresTextArray(groups)),
                   roles = \(PostgresTextArray(roles.sorted().map(\.rawValue)))
            WHERE operator = \(operatorID) AND groups IS NOT NULL AND ended_at IS NULL AND expires_at > now()
            """)
    }

    /// Ends an operator's live sessions: every one, or the OIDC ones (`oidcOnly`: the provider
    /// vouched for the operator, whose groups map to no role any more). Returns how many ended.
    @discardableResult
    func endSessions(operatorID: String, oidcOnly: Bool = false) throws -> Int {
        try pool.withConnection { try Self.endSessions(operatorID: operatorID, oidcOnly: oidcOnly, on: $0) }
    }

    private static func endSessions(operatorID: String, oidcOnly: Bool, on connection: PostgresConnection) throws -> Int {
        try connection.query(
            """
            UPDATE console_sessions SET ended_at = now()
            WHERE operator = \(operatorID) AND ended_at IS NULL AND expires_at > now()
              AND (\(oidcOnly)::boolean IS FALSE OR groups IS NOT NULL)
            """
        ).affectedRows
    }

    /// `appleid-broker console end-sessions`: ends every live session of an operator at once
    /// (a sign-in link's role cannot be taken back otherwise), audited `console.sessions_ended`.
    public func endSessions(operatorID: String, actor: String) throws -> Int {
        try pool.withTransaction { connection in
            let ended = try Self.endSessions(operatorID: operatorID, oidcOnly: false, on: connection)
            try Self.audit(
                connection, actor: actor, action: "console.sessions_ended", target: "console_session",
                subject: "console:\(operatorID)", detail: ["sessions": .integer(Int64(ended))])
            return ended
        }
    }

    /// Ends the session on the server: its cookie, replayed, signs nobody in.
    func end(secret: String) throws {
        try pool.query("UPDATE console_sessions SET ended_at = now() WHERE id_hash = \(Self.hash(secret)) AND ended_at IS NULL")
    }

    // MARK: Sign-in links

    /// A single-use link token for `operatorID` with `role`, valid for `ttlSeconds`; audited.
    public func createLink(operatorID: String, role: ConsoleRole, ttlSeconds: Int, actor: String) throws -> String {
        try createLink(operatorID: operatorID, roles: [role], ttlSeconds: ttlSeconds, actor: actor)
    }

    /// A single-use link token for `operatorID` with every role of `roles` (at least one), valid
    /// for `ttlSeconds`; audited. `console_links` holds one role per row (sql/0018), so a link
    /// with several roles is several rows made and used together: the first role's row is keyed
    /// by the token's hash as a one-role link is, each further role's by `linkRoleHash`.
    public func createLink(operatorID: String, roles: Set<ConsoleRole>, ttlSeconds: Int, actor: String) throws -> String {
        let ordered = roles.sorted()
        precondition(!ordered.isEmpty, "a sign-in link carries at least one role")
        let token = Self.newSecret()
        try pool.withTransaction { connection in
            for (index, role) in ordered.enumerated() {
                let key = index == 0 ? Self.hash(token) : Self.linkRoleHash(token, role)
                try connection.query(
                    """
                    INSERT INTO console_links (token_hash, operator, role, expires_at)
                    VALUES (\(key), \(operatorID), \(role.rawValue), now() + make_interval(secs => \(ttlSeconds)))
                    """)
            }
            try Self.audit(
                connection, actor: actor, action: "console.link_created", target: "console_link",
                subject: "console:\(operatorID)",
                detail: [
                    "role": .string(ordered.map(\.rawValue).joined(separator: ",")), "ttl_seconds": .integer(Int64(ttlSeconds)),
                ])
        }
        return token
    }

    /// The key of a link's row for a further role: a hash only the token's holder can compute,
    /// never equal to another token's plain hash.
    static func linkRoleHash(_ token: String, _ role: ConsoleRole) -> [UInt8] {
        SHA256.hash("console-link|\(role.rawValue)|" + token)
    }

    /// Uses a link up: the operator and the roles it was for, once; nil when unknown, used or
    /// expired. Every row of the link is used in the one statement.
    func redeemLink(token: String) throws -> (operatorID: String, roles: Set<ConsoleRole>)? {
        guard token.utf8.count <= 64 else { return nil }
        let keys = PostgresTextArray(
            ([Self.hash(token)] + ConsoleRole.allCases.map { Self.linkRoleHash(token, $0) }).map(Hex.encode))
        return try pool.withTransaction { connection in
            let rows = try connection.query(
                """
                UPDATE console_links SET used_at = now()
                WHERE token_hash IN (SELECT decode(key, 'hex') FROM unnest(\(keys)::text[]) AS key)
                  AND used_at IS NULL AND expires_at > now()
                RETURNING operator, role
                """)
            guard let first = rows.first else { return nil }
            let operatorID = try first.decode(String.self, "operator")
            var roles: Set<ConsoleRole> = []
            for row in rows {
                guard try row.decode(String.self, "operator") == operatorID,
                    let role = ConsoleRole(rawValue: try row.decode(String.self, "role"))
                else { return nil }
                roles.insert(role)
            }
            try Self.audit(
                connection, actor: "console:\(operatorID)", action: "console.link_redeemed", target: "console_session",
                subject: "console:\(operatorID)",
                detail: ["role": .string(roles.sorted().map(\.rawValue).joined(separator: ","))])
            return (operatorID, roles)
        }
    }

    // MARK: OpenID Connect transactions

    /// What a sign-in under way keeps on the server, keyed by the hash of its `state`.
    struct OIDCTransaction {
        var nonce: String
        var verifier: String
        var returnTo: String
        /// The hash of the session a step-up re-authenticates; nil for a first sign-in.
        var stepUpOf: [UInt8]?
    }

    /// The table holds `oidcTransactionLimit` live sign-ins already.
    struct OIDCTransactionsFull: Error {}

    /// Stores a transaction for ten minutes; returns its `state`. Expired ones go first, so
    /// abandoned sign-ins leave nothing behind for long; past the limit nothing is stored.
    func beginOIDC(_ transaction: OIDCTransaction) throws -> String {
        let state = Self.newSecret()
        try pool.query("DELETE FROM console_oidc_transactions WHERE expires_at < now()")
        let live = try pool.query("SELECT count(*) FROM console_oidc_transactions").single().decode(Int.self, 0)
        guard live < oidcTransactionLimit else { throw OIDCTransactionsFull() }
        try pool.query(
            """
            INSERT INTO console_oidc_transactions (state_hash, nonce, verifier, return_to, step_up_of, expires_at)
            VALUES (\(Self.hash(state)), \(transaction.nonce), \(transaction.verifier), \(transaction.returnTo),
                    \(transaction.stepUpOf), now() + interval '10 minutes')
            """)
        return state
    }

    /// Takes the transaction of `state` (once: it is deleted); nil when unknown or expired.
    func takeOIDC(state: String) throws -> OIDCTransaction? {
        guard state.utf8.count <= 64,
            let row = try pool.query(
                """
                DELETE FROM console_oidc_transactions WHERE state_hash = \(Self.hash(state))
                RETURNING nonce, verifier, return_to, step_up_of, expires_at > now() AS live
                """
            ).first,
            try row.decode(Bool.self, "live")
        else { return nil }
        return OIDCTransaction(
            nonce: try row.decode(String.self, "nonce"), verifier: try row.decode(String.self, "verifier"),
            returnTo: try row.decode(String.self, "return_to"), stepUpOf: try row.decode([UInt8]?.self, "step_up_of"))
    }

    /// The live session whose id hashes to `hash` (the one a step-up renews), without its secret.
    func endSession(hash: [UInt8]) throws -> (operatorID: String, ended: Bool) {
        guard
            let row = try pool.query(
                """
                UPDATE console_sessions SET ended_at = now()
                WHERE id_hash = \(hash) AND ended_at IS NULL AND expires_at > now()
                RETURNING operator
                """
            ).first
        else { return ("", false) }
        return (try row.decode(String.self, "operator"), true)
    }

    /// Sessions signed in and not ended or expired (the overview).
    func activeSessions() throws -> Int {
        try pool.query("SELECT count(*) AS n FROM console_sessions WHERE ended_at IS NULL AND expires_at > now()").single()
            .decode(Int.self, "n")
    }

    /// Rows dropped at most per table and round, so one round's transaction stays short however
    /// many piled up.
    package static let pruneBatch = 1000

    /// Expired sessions (sql/0018: ended ones are kept until they expire) and expired sign-in
    /// links, used or not: neither signs anybody in any more. Returns the larger count.
    @discardableResult
    func pruneExpired() throws -> Int {
        let sessions = try pool.query(
            """
            DELETE FROM console_sessions WHERE id_hash IN (
                SELECT id_hash FROM console_sessions WHERE expires_at < now() ORDER BY expires_at LIMIT \(Self.pruneBatch))
            RETURNING 1
            """
        ).count
        let links = try pool.query(
            """
            DELETE FROM console_links WHERE token_hash IN (
                SELECT token_hash FROM console_links WHERE expires_at < now() ORDER BY expires_at LIMIT \(Self.pruneBatch))
            RETURNING 1
            """
        ).count
        return max(sessions, links)
    }

    // MARK: Audit

    /// One `console.*` row in `audit_log` (BrokerCore's `AuditLog`): the operator as actor, the
    /// target acted on and the outcome; identifiers and hashes only, never a body or a term.
    func audit(
        actor: String, action: String, target: String?, outcome: AuditOutcome = .succeeded, subject: String? = nil,
        deletionID: UUID? = nil, detail: [String: JSONValue] = [:]
    ) throws {
        try AuditLog.record(
            pool, actor: actor, action: action, target: target, outcome: outcome, subject: subject, deletionID: deletionID,
            detail: detail)
    }

    /// The row is BrokerCore's `audit_log`, written by its `AuditLog` (the console's own SQL
    /// touches only `console_*`).
    static func audit(
        _ connection: PostgresConnection, actor: String, action: String, target: String?, outcome: AuditOutcome = .succeeded,
        subject: String? = nil, deletionID: UUID? = nil, detail: [String: JSONValue] = [:]
    ) throws {
        try AuditLog.record(
            connection, actor: actor, action: action, target: target, outcome: outcome, subject: subject,
            deletionID: deletionID, detail: detail)
    }
}

/// The console's tables are pruned in BrokerCore's housekeeping rounds, by the console's own SQL.
extension ConsoleSessionStore: ModulePruning {
    package func prune() throws -> Bool { try pruneExpired() == Self.pruneBatch }
}
