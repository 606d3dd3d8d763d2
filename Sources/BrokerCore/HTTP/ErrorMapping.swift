import HTTPServer
import PostgresClient

/// Turns errors that are not `Problem`s into problems: a database outage is 503 with
/// `Retry-After`, so callers (Apple included) retry; anything else stays a 500.
enum ErrorMapping {
    static func problem(for error: any Error) -> Problem? {
        if let error = error as? PostgresError, error.isUnavailable {
            return .unavailable(code: "database_unavailable", detail: "the database is unavailable; retry shortly")
        }
        return nil
    }
}
