import BrokerCore
import Synchronization

/// Process-wide health flags read by `/readyz`.
public final class HealthState: Sendable {
    private let shuttingDown = Atomic<Bool>(false)

    public init() {}

    public var isShuttingDown: Bool { shuttingDown.load(ordering: .acquiring) }

    public func beginShutdown() { shuttingDown.store(true, ordering: .releasing) }
}
