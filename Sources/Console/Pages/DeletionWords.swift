import BrokerCore
import Foundation

/// Deletion states and steps in words, for people. Never "deleted" before the purge ran:
/// a request that is waiting, revoking or failed has deleted nothing yet.
enum DeletionWords {
    static func state(_ state: DeletionState) -> String {
        switch state {
        case .requested: "Requested: waiting for the deletion job (nothing deleted yet)"
        case .revoking: "Revoking tokens at Apple (nothing deleted yet)"
        case .purging: "Purging the account data"
        case .done: "Deleted: account data purged"
        case .failed: "Failed: stopped after repeated errors (nothing deleted yet); can be retried"
        }
    }

    /// A step is named as the action it tried; its outcome column says how it went, so a
    /// revocation Apple refused never reads as "revoked" beside "will retry".
    static func step(_ step: DeletionStep) -> String {
        switch step {
        case .codeExchange: "Exchange the authorization code at Apple"
        case .revoke: "Revoke the refresh token at Apple"
        case .revokeAccessToken: "Revoke the access token at Apple"
        case .revokeSkipped: "Revocation skipped (Apple deleted the account itself)"
        case .nothingToRevoke: "No token to revoke"
        case .purge: "Purge the account data"
        }
    }

    static func outcome(_ outcome: DeletionStepOutcome) -> String {
        switch outcome {
        case .revoked: "revoked"
        case .alreadyInvalid: "already invalid at Apple (counts as revoked)"
        case .retry: "Apple unavailable, will retry"
        case .error: "Apple refused, will retry"
        case .requestError: "request refused by Apple (invalid_request), will retry"
        case .undecryptable: "stored token unreadable"
        case .skipped: "skipped"
        case .manualRevocationRequired: "manual revocation required (TN3194)"
        case .exchanged: "exchanged"
        case .codeInvalid: "code invalid"
        case .idTokenInvalid: "identity token invalid"
        case .wrongUser: "code of another user"
        case .noIdentity: "no identity"
        case .answerLost: "Apple's answer lost (code not sent again)"
        case .done: "done"
        }
    }

    static func revocation(_ revocation: AppleRevocation?) -> String {
        switch revocation {
        case nil: "not yet known"
        case .revoked: "every token revoked at Apple"
        case .alreadyInvalid: "tokens were already invalid at Apple"
        case .skippedAppleInitiated: "not needed: the user deleted the account at Apple"
        case .manualRequired: "manual: no token to revoke, the user must stop using Sign in with Apple in Settings (TN3194)"
        }
    }

    /// The answer is due one month after receipt (Art. 12(3) GDPR), later when extended.
    static func due(receivedAt: Date?, createdAt: Date, extendedUntil: Date?) -> Date {
        DeletionDeadline.due(receivedAt: receivedAt, createdAt: createdAt, extendedUntil: extendedUntil)
    }

    static func daysLeft(_ due: Date, state: DeletionState) -> String {
        if state == .done { return "answered" }
        let days = Int((due.timeIntervalSinceNow / 86_400).rounded(.up))
        return days < 0 ? "\(-days) days overdue" : "\(days) days"
    }
}
