/// An error from PostgreSQL or from this client, with a stable `code` and the server's SQLSTATE.
///
/// `description` names the code, SQLSTATE and constraint only. It never contains bind
/// parameters, and never the server's message text, which can quote input values
/// (`invalid input syntax for type uuid: "…"`); read `serverMessage` deliberately when
/// that text is safe to show.
public struct PostgresError: Error, Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    /// Stable error codes.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        init(_ name: String) { self.name = name }
        public var description: String { name }

        /// A connection could not be established.
        public static let connectionFailed = Code("connection_failed")
        /// The connection broke during a query; the statement may or may not have run.
        public static let connectionLost = Code("connection_lost")
        /// The connection broke while COMMIT was in flight: the transaction may have committed.
        public static let commitOutcomeUnknown = Code("commit_outcome_unknown")
        /// The server rejected a statement; see `sqlState`.
        public static let queryFailed = Code("query_failed")
        /// No connection became free within the pool's acquire timeout.
        public static let poolTimeout = Code("pool_timeout")
        /// The pool is closed.
        public static let poolClosed = Code("pool_closed")
        /// A column could not be decoded as the requested Swift type.
        public static let decodingFailed = Code("decoding_failed")
        /// A bind value cannot be sent (for example text containing a NUL byte).
        public static let invalidBind = Code("invalid_bind")
        /// The configuration (DATABASE_URL) is not usable.
        public static let invalidConfiguration = Code("invalid_configuration")
    }

    public let code: Code
    /// Five-character SQLSTATE from the server, e.g. `23505` for a unique violation.
    public let sqlState: String?
    /// The constraint a violation names, if any.
    public let constraint: String?
    /// The server's or libpq's primary message. May quote input values: not for logs.
    public let serverMessage: String?

    public init(_ code: Code, sqlState: String? = nil, constraint: String? = nil, serverMessage: String? = nil) {
        self.code = code
        self.sqlState = sqlState
        self.constraint = constraint
        self.serverMessage = serverMessage
    }

    public var description: String {
        var text = "PostgresError.\(code)"
        if let sqlState { text += " (SQLSTATE \(sqlState)\(Self.conditionNames[sqlState].map { " \($0)" } ?? ""))" }
        if let constraint { text += " constraint \(constraint)" }
        // A refused connection is named by the server's or libpq's reason (bad password, TLS
        // verification, PgBouncer refusing a parameter): it quotes hosts, users and database
        // names from the configuration, never request input, and without it the operator
        // sees only `connection_failed`.
        if code == .connectionFailed, let serverMessage {
            text +=
                ": "
                + serverMessage.split(whereSeparator: \.isNewline).map { $0.split(separator: " ").joined(separator: " ") }
                .filter { !$0.isEmpty }.joined(separator: " ")
        }
        return text
    }

    public var debugDescription: String { description }

    /// A unique-constraint violation (23505).
    public var isUniqueViolation: Bool { sqlState == "23505" }
    /// A foreign-key violation (23503).
    public var isForeignKeyViolation: Bool { sqlState == "23503" }

    /// Serialization failure (40001) or deadlock (40P01): retrying the transaction may succeed.
    public var isTransientTransactionFailure: Bool { sqlState == "40001" || sqlState == "40P01" }

    /// The database is unreachable or went away: callers should answer 503 and retry later.
    public var isUnavailable: Bool {
        switch code {
        case .connectionFailed, .connectionLost, .commitOutcomeUnknown, .poolTimeout, .poolClosed: return true
        default: break
        }
        guard let sqlState else { return false }
        // 08: connection exception; 57P01-03: admin shutdown, crash shutdown, cannot connect now;
        // 53300: too many connections.
        return sqlState.hasPrefix("08") || ["57P01", "57P02", "57P03", "53300"].contains(sqlState)
    }

    /// Readable names for the SQLSTATEs this service meets most.
    static let conditionNames: [String: String] = [
        "23505": "unique_violation", "23503": "foreign_key_violation", "23502": "not_null_violation",
        "23514": "check_violation", "40001": "serialization_failure", "40P01": "deadlock_detected",
        "42P01": "undefined_table", "42703": "undefined_column", "42601": "syntax_error",
        "22P02": "invalid_text_representation", "57014": "query_canceled", "57P01": "admin_shutdown",
        "57P03": "cannot_connect_now", "53300": "too_many_connections", "25P02": "in_failed_sql_transaction",
    ]
}
