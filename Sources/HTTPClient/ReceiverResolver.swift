import Foundation
import Synchronization

/// Resolves a receiver's host name (a webhook's, a relying party's) to the public addresses a
/// request is pinned to (`OutboundAddress`), within a time limit. getaddrinfo has none of its
/// own (a resolver that does not answer holds a lane for resolv.conf's timeouts times its
/// attempts), so it runs on a thread of its own and the caller stops waiting at `timeout`; the
/// thread ends when getaddrinfo returns and its answer is dropped. At most `maximumInFlight`
/// lookups run at once: past that a lookup fails at once rather than pile up threads behind a
/// dead resolver.
package struct ReceiverResolver: Sendable {
    var timeout: Duration
    package var maximumInFlight = 64
    /// The lookup itself (replaced in tests).
    var lookup: @Sendable (String) throws -> [String] = { try OutboundAddress.publicAddresses(of: $0) }
    private let inFlight = InFlight()

    package enum Failure: Error, Equatable {
        /// No answer in time, or too many lookups waiting.
        case timedOut
    }

    private final class InFlight: Sendable {
        let count = Atomic<Int>(0)
    }

    private final class Outcome: @unchecked Sendable {
        let lock = NSLock()
        var result: Result<[String], any Error>?
    }

    package init(timeout: Duration, lookup: (@Sendable (String) throws -> [String])? = nil) {
        self.timeout = timeout
        if let lookup { self.lookup = lookup }
    }

    package func publicAddresses(of host: String) throws -> [String] {
        guard inFlight.count.add(1, ordering: .relaxed).newValue <= maximumInFlight else {
            inFlight.count.subtract(1, ordering: .relaxed)
            throw Failure.timedOut
        }
        let outcome = Outcome()
        let done = DispatchSemaphore(value: 0)
        let lookup = lookup
        let inFlight = inFlight
        Thread.detachNewThread {
            let result = Result { try lookup(host) }
            outcome.lock.withLock { outcome.result = result }
            inFlight.count.subtract(1, ordering: .relaxed)
            done.signal()
        }
        let milliseconds = Int(timeout.components.seconds) * 1000 + Int(timeout.components.attoseconds / 1_000_000_000_000_000)
        guard done.wait(timeout: .now() + .milliseconds(milliseconds)) == .success,
            let result = outcome.lock.withLock({ outcome.result })
        else { throw Failure.timedOut }
        return try result.get()
    }
}
