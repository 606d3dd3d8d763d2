import HTTPServer
import Observability

/// Starts an HTTP server of a test's own on a free loopback port (`port`) serving `router`:
/// two worker threads, no access log, its errors kept in a capturing log named `label`, and a
/// short shutdown grace so a test's `deinit { server.shutdown() }` does not hold it up.
public func startLoopbackServer(_ router: Router, label: String) throws -> HTTPServer {
    var configuration = HTTPServer.Configuration()
    configuration.listen = "127.0.0.1:0"
    configuration.accessLog = false
    configuration.workerThreads = 2
    configuration.shutdownGracePeriod = .milliseconds(100)
    let server = HTTPServer(
        configuration: configuration, router: router, logger: Logger(label: label, sink: .capturing(level: .error)),
        metrics: MetricsRegistry())
    try server.start()
    return server
}
