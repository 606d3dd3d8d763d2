import BrokerCore
import Foundation
import HTTPServer
import Observability
import StrictJSON
import Synchronization

/// Console sign-ins that failed, in the audit log (`console.sign_in_refused`, outcome
/// `refused`) beside the log line: the method (`oidc`, `step_up`, `link`), a stable reason
/// code and, where the provider vouched for one, the operator; never the code, the state, the
/// token or the client's address.
///
/// Anyone can fail a sign-in, and audit rows are kept for good, so the rows are bounded for
/// all addresses together: bursts of `burst`, then one every `1 / rate` seconds; the failures
/// beyond are counted, logged, and the next row written says how many were left out
/// (`suppressed`). With the defaults that is at most 8,700 rows a day whatever is sent.
final class SignInFailures: Sendable {
    let sessions: ConsoleSessionStore
    let logger: Logger
    private let budget: RateLimiter
    private let suppressed = Atomic<Int>(0)

    init(sessions: ConsoleSessionStore, logger: Logger, rate: Double = 0.1, burst: Double = 60) {
        self.sessions = sessions
        self.logger = logger
        budget = RateLimiter(rate: rate, burst: burst, maximumKeys: 1)
    }

    /// Logs and audits one failed sign-in.
    /// - Parameters:
    ///   - operatorID: the operator the identity provider named, when it did (a valid ID token
    ///     whose groups map to no role); nil: nobody is known.
    func record(method: String, reason: String, operatorID: String? = nil, detail: String? = nil) {
        var fields = [("method", method), ("reason", reason)]
        if let detail { fields.append(("detail", detail)) }
        logger.warning("console sign-in refused", fields)
        guard budget.acquire("all") == nil else {
            suppressed.add(1, ordering: .relaxed)
            return
        }
        var row: [String: JSONValue] = ["method": .string(method), "reason": .string(reason)]
        let left = suppressed.exchange(0, ordering: .relaxed)
        if left > 0 { row["suppressed"] = .integer(Int64(left)) }
        do {
            try sessions.audit(
                actor: operatorID.map { "console:\($0)" } ?? "anonymous", action: "console.sign_in_refused",
                target: "console_session", outcome: .refused, subject: operatorID.map { "console:\($0)" }, detail: row)
        } catch {
            // The refusal stands whether or not its row could be written.
            suppressed.add(left + 1, ordering: .relaxed)
            logger.error("console sign-in refusal not audited", [("error", "\(type(of: error))")])
        }
    }
}
