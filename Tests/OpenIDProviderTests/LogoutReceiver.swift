import Foundation
import HTTPClient
import HTTPServer
import Locking
import Synchronization
import TestSupport

/// A relying party's back-channel logout endpoint on loopback: records each form-posted
/// `logout_token`; answers `status` (200 unless told otherwise).
final class LogoutReceiver: Sendable {
    /// What the server's handler shares with the test.
    private final class State: Sendable {
        let tokens = Lock<[String]>([])
        let status = Lock<Int>(200)
        let attempts = Lock<Int>(0)
    }
    private let state = State()
    private let server: HTTPServer

    var url: String { "http://127.0.0.1:\(server.port)/logout" }
    var received: [String] { state.tokens.withLock { $0 } }
    /// Every POST, whatever it was answered.
    var attempts: Int { state.attempts.withLock { $0 } }

    func answer(_ status: Int) { state.status.withLock { $0 = status } }

    init() throws {
        var router = Router()
        let state = state
        router.post("/logout") { request in
            state.attempts.withLock { $0 += 1 }
            let status = state.status.withLock { $0 }
            guard status == 200 else { return HTTPResponse(status: status) }
            guard request.mediaType == "application/x-www-form-urlencoded",
                let token = FormEncoding.fields(String(decoding: request.body, as: UTF8.self))["logout_token"]
            else { return HTTPResponse(status: 400) }
            state.tokens.withLock { $0.append(token) }
            return HTTPResponse(status: 200, headers: ["Cache-Control": "no-store"])
        }
        server = try startLoopbackServer(router, label: "rp")
    }

    deinit { server.shutdown() }

    /// Waits until `count` tokens arrived (or `seconds` passed); what arrived.
    func wait(for count: Int, seconds: Double = 15) -> [String] {
        let deadline = Date().addingTimeInterval(seconds)
        while received.count < count && Date() < deadline { Thread.sleep(forTimeInterval: 0.05) }
        return received
    }
}
