import HTTPServer
import Observability
import PostgresClient
import StrictJSON

/// `/healthz`, `/readyz` and `/metrics`: for load balancers, orchestrators and Prometheus.
enum OperationsRoutes {
    /// - Parameter servesMetrics: false when `/metrics` has a listener of its own (`BROKER_METRICS_LISTEN`).
    static func register(
        on router: inout Router, database: Database, metrics: MetricsRegistry, health: HealthState, servesMetrics: Bool = true
    ) {
        router.get("/healthz") { _ in
            .json(.object(["status": "ok"]))
        }
        router.get("/readyz") { _ in
            guard !health.isShuttingDown else {
                throw BrokerError(.shuttingDown, "the service is shutting down", retryAfterSeconds: 1)
            }
            do {
                try database.ping()
            } catch let error as PostgresError where error.isUnavailable {
                throw BrokerError(.databaseUnavailable, "PostgreSQL is not reachable", retryAfterSeconds: 5)
            }
            return .json(.object(["status": "ready"]))
        }
        if servesMetrics { registerMetrics(on: &router, metrics: metrics) }
        let description = Array((EmbeddedFiles.text(named: "openapi.json") ?? "{}").utf8)
        router.get("/openapi.json") { _ in
            HTTPResponse(status: 200, headers: ["Content-Type": "application/json"], body: description)
        }
    }

    /// `GET /metrics`, on the main router or the metrics listener's.
    static func registerMetrics(on router: inout Router, metrics: MetricsRegistry) {
        router.get("/metrics") { _ in
            .text(metrics.render(), contentType: "text/plain; version=0.0.4; charset=utf-8")
        }
    }
}
