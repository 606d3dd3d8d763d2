import CLibpq
import Foundation

/// How to reach PostgreSQL: a `postgres://` URL or a libpq conninfo string
/// (`host=/run/pg dbname=broker`), plus the session settings this client relies on.
public struct PostgresConfiguration: Sendable, Hashable {
    /// The URL or conninfo, passed to libpq as `dbname` with `expand_dbname` so libpq parses it.
    public var connectionString: String
    /// Seconds libpq waits for a connection to be established (libpq's minimum is 2).
    public var connectTimeoutSeconds: Int = 5
    /// Server-side limit for one statement; nil leaves the server's default.
    public var statementTimeoutMilliseconds: Int? = 30_000
    /// `application_name` shown in `pg_stat_activity`; nil sends none (libpq's default).
    public var applicationName: String?

    /// Validates `connectionString` with libpq's own parser.
    /// - Throws: `PostgresError.invalidConfiguration` with libpq's reason.
    public init(connectionString: String) throws {
        var message: UnsafeMutablePointer<CChar>? = nil
        guard let options = PQconninfoParse(connectionString, &message) else {
            let reason = message.map { String(cString: $0).trimmingCharacters(in: .whitespacesAndNewlines) }
            if let message { PQfreemem(message) }
            throw PostgresError(.invalidConfiguration, serverMessage: reason ?? "unparseable connection string")
        }
        PQconninfoFree(options)
        self.connectionString = connectionString
    }

    /// Keywords and values for `PQconnectdbParams`. Ours come after the connection string
    /// so that the session settings the decoder depends on always apply.
    func connectParameters() -> [(String, String)] {
        var session = "-c client_min_messages=warning -c DateStyle=ISO -c TimeZone=UTC -c IntervalStyle=iso_8601 -c bytea_output=hex"
        if let statementTimeoutMilliseconds {
            session += " -c statement_timeout=\(statementTimeoutMilliseconds)"
        }
        return (applicationName.map { [("application_name", $0)] } ?? []) + [
            ("connect_timeout", String(max(2, connectTimeoutSeconds))),
            ("dbname", connectionString),
            ("client_encoding", "UTF8"),
            ("options", session),
        ]
    }
}
