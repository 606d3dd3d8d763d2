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
        case .nothingToRevoke: "No live token for this app group"
        case .purge: "Purge the account data"
        case .checkToken: "Check the refresh token at Apple (a refresh)"
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
        case .alive: "alive: Apple refreshed it, so its revocation counts"
        case .tokenDead: "dead at Apple (a password change or a revocation): revoking it would end nothing"
        case .throttled: "Apple answered 429: the code was not used, tried again"
        }
    }

    /// What a deletion came to at Apple in all; `group` says it per app group.
    static func revocation(_ revocation: AppleRevocation?) -> String {
        switch revocation {
        case nil: "not yet known"
        case .revoked: "revoked at Apple for every app group the user used (a live token's revocation each)"
        case .alreadyInvalid: "nothing to end at Apple: the user had already stopped using every app group"
        case .skippedAppleInitiated: "not needed: the user deleted the account at Apple"
        case .manualRequired:
            "manual for at least one app group: no live token to revoke there, the user must stop using Sign in with Apple"
                + " for it in Settings (TN3194); see each app group"
        }
    }

    /// What a deletion came to at Apple for one app group.
    static func group(_ revocation: AppGroupRevocation) -> String {
        switch revocation {
        case .revoked: "revoked at Apple (a token Apple had just refreshed, then revoked)"
        case .alreadyInvalid: "nothing to end: Apple said the user stopped using this app group"
        case .manualRequired:
            "manual: no live token; the user must stop using Sign in with Apple for this app in Settings (TN3194)"
        case .transferred: "not this team's: the app moved to another team"
        }
    }

    /// A group's TN3194 follow-up, for people.
    static func followUp(_ group: DeletionRecord.AppGroup) -> String {
        guard group.revocation == .manualRequired else { return "none" }
        guard let closed = group.followUpClosedAt else {
            return "open: ask the user to stop using Sign in with Apple for the app"
        }
        let by =
            switch group.followUpClosedBy {
            case "consent-revoked": "the user stopped using the app at Apple (consent-revoked)"
            case "account-delete": "the user deleted the Apple Account (account-delete)"
            case "retention": "a dormant user's deletion: nobody to ask"
            default: "closed"
            }
        return "closed \(RFC3339Date.string(closed)): \(by)"
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
