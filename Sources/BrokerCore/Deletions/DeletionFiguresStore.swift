import Foundation
import PostgresClient

/// A count per UTC day and category, for the console's overview charts.
package struct DailyCount: Sendable, Equatable {
    /// Midnight UTC of the day.
    package var day: Date
    package var category: String
    package var count: Int

    package init(day: Date, category: String, count: Int) {
        self.day = day
        self.category = category
        self.count = count
    }
}

/// What the deletion job did day by day (the console's overview), read from the deletion
/// tables; bounded by the days asked for (at most 92) and a handful of categories.
extension DeletionStore {
    /// Deletions opened on each of the last `days` UTC days (today included), by where each
    /// stands now: `done`, `failed` or `in_progress`.
    package func openedByOutcome(days: Int) throws -> [DailyCount] {
        let days = min(max(days, 1), 92)
        return try pool.query(
            """
            SELECT date_trunc('day', created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS day,
                   CASE state WHEN 'done' THEN 'done' WHEN 'failed' THEN 'failed' ELSE 'in_progress' END AS category,
                   count(*) AS n
            FROM deletion_requests
            WHERE created_at >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - make_interval(days => \(days - 1))
            GROUP BY 1, 2
            """
        ).map(Self.dailyCount)
    }

    /// Apple's answers to the deletion job (revocations and handed-over codes) on each of the
    /// last `days` UTC days: `revoked` (revoked, or dead already), `exchanged`, `refused`
    /// (Apple said no: an error, a code it would not take, a token for someone else) and
    /// `no_answer` (unavailable, retried; an exchange whose answer was lost).
    package func appleAnswers(days: Int) throws -> [DailyCount] {
        let days = min(max(days, 1), 92)
        return try pool.query(
            """
            SELECT date_trunc('day', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS day,
                   CASE WHEN outcome IN ('revoked', 'already_invalid') THEN 'revoked'
                        WHEN outcome = 'exchanged' THEN 'exchanged'
                        WHEN outcome IN ('retry', 'answer_lost') THEN 'no_answer'
                        ELSE 'refused' END AS category,
                   count(*) AS n
            FROM deletion_steps
            WHERE step IN ('revoke', 'revoke_access_token', 'code_exchange')
              AND outcome IN ('revoked', 'already_invalid', 'exchanged', 'retry', 'answer_lost', 'error', 'request_error',
                              'code_invalid', 'id_token_invalid', 'wrong_user')
              AND at >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - make_interval(days => \(days - 1))
            GROUP BY 1, 2
            """
        ).map(Self.dailyCount)
    }

    static func dailyCount(_ row: PostgresRow) throws -> DailyCount {
        DailyCount(
            day: try row.decode(Date.self, "day"), category: try row.decode(String.self, "category"),
            count: try row.decode(Int.self, "n"))
    }
}
