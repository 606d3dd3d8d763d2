import BrokerCore
import Foundation
import PostgresClient

/// The follow-up queues (docs/console.md, "Follow-ups"), read from what the broker keeps,
/// through BrokerCore's deletion store (see `ConsoleStore`).
extension ConsoleStore {
    typealias ManualRevocation = DeletionStore.ManualRevocation

    /// TN3194 follow-ups, per app group (see `DeletionStore.manualRevocations`).
    func manualRevocations() throws -> [ManualRevocation] { try deletions.store.manualRevocations() }

    /// When the TN3194 follow-up of a deletion the previous release decided (no app groups)
    /// closed; nil while open.
    func legacyFollowUpClosedAt(deletionID: UUID) throws -> Date? {
        try deletions.store.legacyFollowUpClosedAt(deletionID: deletionID)
    }

    typealias FailedRevocation = DeletionStore.FailedRevocation

    /// The last revocation step of each failed deletion per client id, when it did not revoke.
    func failedRevocations() throws -> [FailedRevocation] { try deletions.store.failedRevocations() }

    typealias LateNotification = DeletionStore.LateNotification

    /// Apple notifications about a sub after the broker deleted it (matched by keyed hash).
    func notificationsAfterDeletion() throws -> [LateNotification] { try deletions.store.notificationsAfterDeletion() }

    /// The identity's e-mail for an audited reveal; nil when there is none.
    func email(userID: UUID, sub: String) throws -> String? { try users.email(userID: userID, sub: sub) }
}
