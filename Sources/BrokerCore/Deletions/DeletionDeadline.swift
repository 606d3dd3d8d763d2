import Foundation

/// When a deletion request must be answered (Art. 12(3) GDPR): one month after its receipt
/// (taken as 30 days; the request's creation when no receipt was recorded), extendable with
/// reasons by up to two further months: to a date after the first month and at most 90 days
/// after receipt. The console shows and extends deadlines through `DeletionService`, which
/// holds this rule; the store's statement enforces the same bounds.
package enum DeletionDeadline {
    /// The answer is due this long after receipt.
    package static let answerWithin: Duration = .seconds(30 * 86_400)
    /// An extension may reach at most this long after receipt.
    package static let extendedAtMost: Duration = .seconds(90 * 86_400)

    /// The due date: the extension's when there is one.
    package static func due(receivedAt: Date?, createdAt: Date, extendedUntil: Date?) -> Date {
        extendedUntil ?? (receivedAt ?? createdAt).addingTimeInterval(Double(answerWithin.components.seconds))
    }
}
