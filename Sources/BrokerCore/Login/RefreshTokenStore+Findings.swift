import Foundation
import PostgresClient

/// What the daily sweep found, as operators read it (the console's operations page).
extension RefreshTokenStore {
    /// A refresh token the sweep found dead (`invalid_grant`, `broker_invalidate_token`) while
    /// Apple sent no `consent-revoked` or `account-delete` about its subject: a revocation (or
    /// password change, forum thread 651237) Apple never told us about. Ids and hashes only.
    package struct SweepFinding: Sendable {
        package var userID: UUID
        package var clientID: String
        package var foundAt: Date
        package var appleError: String?
        package var subjectHash: String
    }

    /// The newest `limit` findings. The sub is read only to compute its keyed hash (as the
    /// notification inbox stores it, `SubjectHasher`), which is all a finding holds of it.
    package func sweepFindings(hasher: SubjectHasher, limit: Int = 100) throws -> [SweepFinding] {
        let found = try pool.query(
            """
            SELECT t.user_id, t.client_id, t.revoked_at, t.last_validation_error, i.team_id, i.sub
            FROM apple_tokens t JOIN apple_identities i ON i.id = t.identity_id
            WHERE t.revoked_reason = 'token_invalid' ORDER BY t.revoked_at DESC LIMIT \(limit)
            """
        ).map { row in
            SweepFinding(
                userID: try row.decode(UUID.self, "user_id"), clientID: try row.decode(String.self, "client_id"),
                foundAt: try row.decode(Date.self, "revoked_at"),
                appleError: try row.decode(String?.self, "last_validation_error"),
                subjectHash: hasher.hash(teamID: try row.decode(String.self, "team_id"), sub: try row.decode(String.self, "sub")))
        }
        let notified = try NotificationStore(pool: pool).revocationsNotified(amongHashes: found.map(\.subjectHash))
        return found.filter { !notified.contains($0.subjectHash) }
    }
}
