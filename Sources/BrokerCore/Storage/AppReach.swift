import Foundation
import PostgresClient

/// What an API key limited to some apps (`api-keys create --client-ids`) may see, in one
/// place: users in one of its apps (sql/0012: `broker_user_client_ids`), or who were when
/// their deletion was requested (`deletion_requests.client_ids`), so the record and the
/// user's events stay visible after the purge. Unlimited keys see everything, at no cost.
enum AppReach {
    static func user(_ id: UUID, visibleTo key: APIKey, pool: PostgresPool) throws -> Bool {
        guard let reach = key.reachArray else { return true }
        return try pool.query(
            """
            SELECT broker_user_client_ids(\(id)) && \(reach)
                OR EXISTS (SELECT 1 FROM deletion_requests d WHERE d.user_id = \(id) AND d.client_ids && \(reach)) AS visible
            """
        ).single().decode(Bool.self, "visible")
    }

    static func deletion(_ id: UUID, visibleTo key: APIKey, pool: PostgresPool) throws -> Bool {
        guard let reach = key.reachArray else { return true }
        return try !pool.query("SELECT 1 FROM deletion_requests WHERE id = \(id) AND client_ids && \(reach)").isEmpty
    }
}
