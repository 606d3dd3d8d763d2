import Foundation
import PostgresClient

/// What an API key limited to some apps (`api-keys create --client-ids`) may see, in one
/// place. Unlimited keys see everything, at no cost.
///
/// A user is in an app when one of its identities signed in last with that client id or a
/// token of that client id is stored (`broker_user_apps`): exactly the key's client ids, never
/// widened to their app groups (a grant row names a whole group by its primary App ID and says
/// nothing about which member the user uses). A user whose deletion was requested stays
/// visible to the apps it was in then (`deletion_requests.client_ids`, written by the
/// `deletion_requests_apps_v2` trigger), so the record and the user's events outlive the purge.
package enum AppReach {
    static func user(_ id: UUID, visibleTo key: APIKey, pool: PostgresPool) throws -> Bool {
        guard let reach = key.reachArray else { return true }
        return try pool.query(
            """
            SELECT broker_user_apps(\(id)) && \(reach)::text[]
                OR EXISTS (SELECT 1 FROM deletion_requests d WHERE d.user_id = \(id) AND d.client_ids && \(reach)::text[])
                AS visible
            """
        ).single().decode(Bool.self, "visible")
    }

    /// Whether the user is also in an app outside the key's reach: an identity, a sign-in
    /// (`apple_identity_apps`: an identity token alone leaves no token) or a token of another
    /// client id, or a grant of an app group none of the key's client ids is in.
    /// Such a user's account is not the key's to delete (`user_shared_with_other_apps`).
    static func user(_ id: UUID, sharedBeyond key: APIKey, pool: PostgresPool) throws -> Bool {
        guard let reach = key.reachArray, let grants = key.grantReachArray else { return false }
        return try pool.query(
            """
            SELECT EXISTS (SELECT 1 FROM apple_identities WHERE user_id = \(id) AND client_id <> ALL (\(reach)::text[]))
                OR EXISTS (SELECT 1 FROM apple_identity_apps a JOIN apple_identities i ON i.id = a.identity_id
                           WHERE i.user_id = \(id) AND a.client_id <> ALL (\(reach)::text[]))
                OR EXISTS (SELECT 1 FROM apple_tokens WHERE user_id = \(id) AND client_id <> ALL (\(reach)::text[]))
                OR EXISTS (SELECT 1 FROM apple_grants WHERE user_id = \(id) AND app_id <> ALL (\(grants)::text[]))
                AS shared
            """
        ).single().decode(Bool.self, "shared")
    }

    package static func deletion(_ id: UUID, visibleTo key: APIKey, pool: PostgresPool) throws -> Bool {
        guard let reach = key.reachArray else { return true }
        return try !pool.query("SELECT 1 FROM deletion_requests WHERE id = \(id) AND client_ids && \(reach)").isEmpty
    }
}
