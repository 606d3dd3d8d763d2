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
    /// Whether a pooler in transaction mode (PgBouncer) may give each transaction another
    /// server session; nil finds out per connection (`PostgresConnection` says how).
    public var transactionPooling: Bool?

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

    /// Keywords and values for `PQconnectdbParams`. No `options` startup parameter:
    /// PgBouncer refuses it ("unsupported startup parameter: options"), and a pooler in
    /// transaction mode would not keep session settings anyway; `sessionSettingsSQL` sends
    /// them with every transaction instead. `application_name` and `client_encoding` are
    /// startup parameters PgBouncer tracks and restores on whichever server it picks.
    func connectParameters() -> [(String, String)] {
        (applicationName.map { [("application_name", $0)] } ?? []) + [
            ("connect_timeout", String(max(2, connectTimeoutSeconds))),
            ("dbname", connectionString),
            ("client_encoding", "UTF8"),
        ]
    }

    /// The settings the decoder and the callers rely on, as one statement. `local` sets them
    /// for the current transaction only (`set_config(…, true)` is `SET LOCAL`): through a
    /// pooler it goes with every BEGIN and in the same pipeline as every autocommit
    /// statement, so nothing is assumed to survive from one transaction to the next.
    func sessionSettingsSQL(local: Bool) -> String {
        var settings = [
            ("DateStyle", "ISO"), ("TimeZone", "UTC"), ("IntervalStyle", "iso_8601"), ("bytea_output", "hex"),
            ("client_min_messages", "warning"),
        ]
        if let statementTimeoutMilliseconds {
            settings.append(("statement_timeout", String(statementTimeoutMilliseconds)))
        }
        return "SELECT " + settings.map { "set_config('\($0.0)', '\($0.1)', \(local))" }.joined(separator: ", ")
    }
}
