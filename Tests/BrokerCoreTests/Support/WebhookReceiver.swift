import BrokerCrypto
import Foundation
import HTTPServer
import Locking
import Observability
import StrictJSON
import Synchronization

/// A webhook receiver on loopback for tests: verifies every Standard Webhooks signature
/// with the subscription's secret and records what arrived; can answer errors, redirect,
/// stall, or be down.
final class WebhookReceiver: Sendable {
    enum Mode: Sendable {
        case accept
        case status(Int)
        case redirect
        case stall(seconds: Double)
    }

    struct Received: Sendable {
        var id: String
        /// The body's `id`: the event's id in the pull feed.
        var eventID: String
        var type: String
        var data: [String: JSONValue]
        var signatureValid: Bool
        /// The delivery as it arrived, for verifiers other than this one.
        var body: [UInt8] = []
        var headers: [String: String] = [:]
        /// When it arrived: a verifier's `now` as a real receiver's would be (a test may verify later).
        var receivedAt = Date()
    }

    private let received = Lock<[Received]>([])
    private let mode = Lock<Mode>(.accept)
    private let secret = Lock<[UInt8]>([])
    private let server = Lock<HTTPServer?>(nil)
    let port: UInt16

    var url: String { "http://127.0.0.1:\(port)/hook" }

    init() throws {
        let first = try Self.makeServer(port: 0, receiver: nil)
        port = first.port
        first.shutdown()
        try start()
    }

    func setSecret(_ whsec: String) {
        secret.withLock { $0 = Array(Data(base64Encoded: String(whsec.dropFirst("whsec_".count))) ?? Data()) }
    }

    func set(_ newMode: Mode) { mode.withLock { $0 = newMode } }

    var deliveries: [Received] { received.withLock { $0 } }

    /// Stops listening (connections are refused) until `start()`.
    func stop() {
        let running = server.withLock { value -> HTTPServer? in
            defer { value = nil }
            return value
        }
        running?.shutdown()
    }

    func start() throws {
        let started = try Self.makeServer(port: port, receiver: self)
        server.withLock { $0 = started }
    }

    deinit { stop() }

    private static func makeServer(port: UInt16, receiver: WebhookReceiver?) throws -> HTTPServer {
        var router = Router()
        router.post("/hook") { request in
            guard let receiver else { return HTTPResponse(status: 503) }
            switch receiver.mode.withLock({ $0 }) {
            case .status(let status): return HTTPResponse(status: status)
            case .redirect: return HTTPResponse(status: 302, headers: ["Location": "http://127.0.0.1:1/elsewhere"])
            case .stall(let seconds): Thread.sleep(forTimeInterval: seconds)
            case .accept: break
            }
            let id = request.headers["webhook-id"] ?? ""
            let timestamp = request.headers["webhook-timestamp"] ?? ""
            let expected =
                "v1,"
                + Data(
                    HMACSHA256.authenticate(
                        Array("\(id).\(timestamp).".utf8) + request.body, key: receiver.secret.withLock { $0 })
                ).base64EncodedString()
            let object = (try? JSONValue.parseObject(request.body)) ?? [:]
            receiver.received.withLock {
                $0.append(
                    Received(
                        id: id, eventID: object["id"]?.stringValue ?? "", type: object["type"]?.stringValue ?? "",
                        data: object["data"]?.objectValue ?? [:],
                        signatureValid: request.headers["webhook-signature"] == expected && !id.isEmpty, body: request.body,
                        headers: Dictionary(request.headers.map { ($0.name.lowercased(), $0.value) }) { first, _ in first }))
            }
            return HTTPResponse(status: 204)
        }
        var configuration = HTTPServer.Configuration()
        configuration.listen = "127.0.0.1:\(port)"
        configuration.accessLog = false
        configuration.workerThreads = 8
        configuration.shutdownGracePeriod = .milliseconds(100)
        let server = HTTPServer(
            configuration: configuration, router: router, logger: Logger(label: "receiver", sink: .capturing(level: .error)),
            metrics: MetricsRegistry())
        try server.start()
        return server
    }
}
