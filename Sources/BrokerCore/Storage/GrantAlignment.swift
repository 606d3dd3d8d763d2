import PostgresClient

/// Keeps `apple_grants` named by each group's primary App ID when `APPLE_APP_GROUPS`
/// changes (or after migration 0007, which could only name a grant by the client id the
/// identity used last): a grant kept under a member client id moves to its group's primary,
/// unless the primary already has one. Idempotent; run at start.
package enum GrantAlignment {
    package static func align(_ pool: PostgresPool, groups: AppGroups) throws {
        // One member at a time: two members' grants of one identity must not both move at once.
        for group in groups.groups {
            for member in group.clientIDs.dropFirst() {
                try pool.query(
                    """
                    UPDATE apple_grants g SET app_id = \(group.primary)
                    WHERE g.app_id = \(member)
                      AND NOT EXISTS (SELECT 1 FROM apple_grants p WHERE p.identity_id = g.identity_id AND p.app_id = \(group.primary))
                    """)
            }
        }
    }
}
