import BrokerCore

/// One part of the running service with its start and stop (swift-service-lifecycle's
/// idea, synchronously): `BrokerApplication` starts its list in order and stops it in
/// reverse, so what depends on another part stops before it.
struct Lifecycle: Sendable {
    let name: String
    let start: @Sendable () throws -> Void
    let stop: @Sendable () -> Void

    init(_ name: String, start: @escaping @Sendable () throws -> Void, stop: @escaping @Sendable () -> Void) {
        self.name = name
        self.start = start
        self.stop = stop
    }
}
