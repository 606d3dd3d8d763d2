import Dispatch
import Foundation
import HTTPClient
import Locking
import Observability
import Synchronization
import TestSupport
import Testing

@testable import HTTPServer

/// Starts a server on a free loopback port for the duration of `body`.
private func withServer<T>(
    _ router: Router, configure: (inout HTTPServer.Configuration) -> Void = { _ in },
    errorMapper: @escaping @Sendable (any Error) -> Problem? = { _ in nil },
    _ body: (HTTPServer, String, MetricsRegistry) throws -> T
) throws -> T {
    var configuration = HTTPServer.Configuration()
    configuration.listen = "127.0.0.1:0"
    configuration.workerThreads = 8
    configuration.accessLog = false
    configure(&configuration)
    let metrics = MetricsRegistry()
    let server = HTTPServer(
        configuration: configuration, router: router, logger: Logger(label: "test", sink: .capturing()),
        metrics: metrics, errorMapper: errorMapper)
    try server.start()
    defer { server.shutdown() }
    return try body(server, "http://127.0.0.1:\(server.port)", metrics)
}

private struct Echo: Codable, Equatable {
    var name: String
    var count: Int
}

private struct Opaque: Error {}

private func demoRouter() -> Router {
    var router = Router()
    router.get("/items/{id}") { request in
        .json(["id": try request.parameter("id"), "q": request.query["q"] ?? ""])
    }
    router.post("/items") { request in
        .json(try request.decodeJSON(Echo.self), status: 201)
    }
    router.get("/boom") { _ in throw Opaque() }
    router.get("/slow") { _ in
        Thread.sleep(forTimeInterval: 0.5)
        return .text("done")
    }
    return router
}

private func problem(_ response: HTTPClientResponse) throws -> [String: Any] {
    #expect(response.header("content-type") == "application/problem+json")
    return try #require(JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any])
}

@Suite("HTTPServer")
struct HTTPServerTests {
    let client = CurlTransport()

    @Test("routes by method and path and binds path parameters and query arguments")
    func routing() throws {
        try withServer(demoRouter()) { _, base, _ in
            let response = try client.send(.init(url: base + "/items/a%20b?q=z%C3%BC"))
            #expect(response.status == 200)
            let object = try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: String]
            #expect(object == ["id": "a b", "q": "zü"])
            #expect(response.header("x-request-id")?.isEmpty == false)

            let created = try client.send(
                .init(
                    method: "POST", url: base + "/items", headers: [("Content-Type", "application/json")],
                    body: Array(#"{"name":"Zoë","count":3}"#.utf8)))
            #expect(created.status == 201)
            #expect(try JSONDecoder().decode(Echo.self, from: Data(created.body)) == Echo(name: "Zoë", count: 3))
        }
    }

    @Test("without a problem type base, problems are RFC 9457's about:blank type")
    func defaultProblemType() throws {
        try withServer(demoRouter()) { _, base, _ in
            let body = try problem(try client.send(.init(url: base + "/nope")))
            #expect(body["type"] as? String == "about:blank")
        }
    }

    @Test("unknown paths get a 404 problem; a known path with the wrong method gets 405 with Allow")
    func notFoundAndMethodNotAllowed() throws {
        try withServer(demoRouter(), configure: { $0.problemTypeBase = "urn:example:problem:" }) { _, base, _ in
            let missing = try client.send(.init(url: base + "/nope", headers: [("X-Request-Id", "req-123")]))
            #expect(missing.status == 404)
            let body = try problem(missing)
            #expect(body["code"] as? String == "not_found")
            #expect(body["status"] as? Int == 404)
            #expect(body["type"] as? String == "urn:example:problem:not_found")
            #expect(body["request_id"] as? String == "req-123")
            #expect(missing.header("x-request-id") == "req-123")

            let wrong = try client.send(.init(method: "DELETE", url: base + "/items/1"))
            #expect(wrong.status == 405)
            #expect(try problem(wrong)["code"] as? String == "method_not_allowed")
            #expect(wrong.header("allow") == "GET, HEAD")
        }
    }

    @Test("invented methods get 501 and one `other` label: 40 of them, up to 4 KiB each, add no series")
    func inventedMethods() throws {
        try withServer(demoRouter()) { _, base, metrics in
            _ = try client.send(.init(url: base + "/items/1"))
            let before = metrics.render().split(separator: "\n").filter { $0.hasPrefix("http_request") }.count
            for index in 0..<40 {
                let method = "X" + String(repeating: "Y", count: index * 100) + String(index)
                let response = try client.send(.init(method: method, url: base + "/items/1"))
                #expect(response.status == 501)
                let body = try problem(response)
                #expect(body["code"] as? String == "not_implemented")
                #expect(!(response.bodyText.contains(method)), "the method is not echoed")
            }
            let text = metrics.render()
            let series = text.split(separator: "\n").filter { $0.hasPrefix("http_request") }
            // The first invented method adds the `other` series (a counter and a histogram's
            // buckets); the next 39 add nothing.
            let added = series.count - before
            #expect(added > 0 && added <= 20, "\(added) new lines")
            #expect(text.contains(#"http_requests_total{route="unmatched",method="other",status="501"} 40"#))
            #expect(!text.contains("XYY"))
            // RFC 9110's methods are known: on a route that does not take them, 405 with Allow.
            for method in ["OPTIONS", "TRACE"] {
                let answer = try client.send(.init(method: method, url: base + "/items/1"))
                #expect(answer.status == 405, "\(method)")
                #expect(answer.header("allow") != nil)
            }
        }
    }

    @Test("a body over the limit gets 413, whether announced by Content-Length or chunked")
    func payloadTooLarge() throws {
        try withServer(demoRouter(), configure: { $0.maximumBodyBytes = 1024 }) { _, base, _ in
            let big = Array(repeating: UInt8(ascii: "a"), count: 4096)
            let response = try client.send(
                .init(method: "POST", url: base + "/items", headers: [("Content-Type", "application/json")], body: big))
            #expect(response.status == 413)
            #expect(try problem(response)["code"] as? String == "payload_too_large")

            let chunked = try client.send(
                .init(
                    method: "POST", url: base + "/items",
                    headers: [("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")], body: big))
            #expect(chunked.status == 413)

            // Exactly at the limit, chunked: accepted (its room is the limit, no more).
            let prefix = #"{"name":""#
            let suffix = #"","count":1}"#
            let atLimit = Array(
                (prefix + String(repeating: "a", count: 1024 - prefix.utf8.count - suffix.utf8.count) + suffix).utf8)
            #expect(atLimit.count == 1024)
            let accepted = try client.send(
                .init(
                    method: "POST", url: base + "/items",
                    headers: [("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")], body: atLimit))
            #expect(accepted.status == 201)

            let small = try client.send(
                .init(
                    method: "POST", url: base + "/items", headers: [("Content-Type", "application/json")],
                    body: Array(#"{"name":"a","count":1}"#.utf8)))
            #expect(small.status == 201)
        }
    }

    @Test("a 40 KB query (the web authorize parameters at their limits, percent-encoded) reaches the handler")
    func longRequestHead() throws {
        // 3,400 four-byte characters percent-encode to 40,800 bytes, more than client_id,
        // return_to and app_state at their documented maxLength (2,816 characters, 33,792
        // bytes). libmicrohttpd's 32 KiB default answered those 414 or 431, or nothing.
        let character = "\u{C0FD0}"
        let value = String(repeating: character, count: 3_400)
        let encoded = try #require(value.addingPercentEncoding(withAllowedCharacters: .alphanumerics))
        #expect(encoded.utf8.count == 40_800)
        try withServer(demoRouter()) { _, base, _ in
            let response = try client.send(.init(url: base + "/items/1?q=" + encoded))
            #expect(response.status == 200)
            let object = try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: String]
            #expect(object?["q"] == value)

            // Past the connection memory the HTTP layer refuses it itself.
            let huge = String(repeating: "a", count: 100_000)
            #expect(try client.send(.init(url: base + "/items/1?q=" + huge)).status == 414)
        }
    }

    @Test("malformed JSON, missing fields and wrong content types get distinct 4xx problems")
    func badJSON() throws {
        try withServer(demoRouter()) { _, base, _ in
            func post(_ body: String, contentType: String = "application/json") throws -> HTTPClientResponse {
                try client.send(
                    .init(method: "POST", url: base + "/items", headers: [("Content-Type", contentType)], body: Array(body.utf8)))
            }
            let malformed = try post("{not json")
            #expect(malformed.status == 400)
            #expect(try problem(malformed)["code"] as? String == "invalid_json")

            let missing = try post(#"{"name":"a"}"#)
            #expect(missing.status == 400)
            let missingBody = try problem(missing)
            #expect(missingBody["code"] as? String == "invalid_request")
            #expect((missingBody["detail"] as? String)?.contains("count") == true)

            let mistyped = try post(#"{"name":"a","count":"three"}"#)
            #expect(try problem(mistyped)["code"] as? String == "invalid_request")

            let wrongType = try post(#"{"name":"a","count":1}"#, contentType: "text/plain")
            #expect(wrongType.status == 415)
            #expect(try problem(wrongType)["code"] as? String == "unsupported_media_type")

            let empty = try post("")
            #expect(empty.status == 400)
        }
    }

    @Test("an unexpected error is a 500 problem that reveals nothing; a mapped error keeps its status")
    func errors() throws {
        try withServer(demoRouter()) { _, base, _ in
            let response = try client.send(.init(url: base + "/boom"))
            #expect(response.status == 500)
            let body = try problem(response)
            #expect(body["code"] as? String == "internal_error")
            #expect(!response.bodyText.contains("Opaque"))
        }
        try withServer(demoRouter(), errorMapper: { _ in .unavailable(code: "database_unavailable", detail: "down") }) {
            _, base, _ in
            let response = try client.send(.init(url: base + "/boom"))
            #expect(response.status == 503)
            #expect(response.header("retry-after") == "5")
            #expect(try problem(response)["code"] as? String == "database_unavailable")
        }
    }

    @Test("100 concurrent requests all succeed and are counted in the metrics")
    func concurrency() throws {
        try withServer(demoRouter()) { _, base, metrics in
            // A hundred threads of our own, all in flight at once (Dispatch's concurrentPerform
            // would run only as many as there are cores).
            let results = onThreads(100) { index -> Bool in
                let response = try CurlTransport().send(.init(url: base + "/items/\(index)"))
                let object = try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: String]
                return response.status == 200 && object?["id"] == String(index)
            }
            #expect(results.allSatisfy { (try? $0.get()) == true })
            let text = metrics.render()
            #expect(text.contains(#"http_requests_total{route="/items/{id}",method="GET",status="200"} 100"#))
            #expect(text.contains(#"http_request_duration_seconds_count{route="/items/{id}",method="GET"} 100"#))
        }
    }

    @Test("graceful shutdown finishes the in-flight request, then refuses new connections")
    func gracefulShutdown() throws {
        try withServer(demoRouter()) { server, base, _ in
            let result = Lock<Result<HTTPClientResponse, any Error>?>(nil)
            let done = DispatchSemaphore(value: 0)
            Thread {
                let outcome = Result { try CurlTransport().send(.init(url: base + "/slow")) }
                result.withLock { $0 = outcome }
                done.signal()
            }.start()
            for _ in 0..<200 where server.inFlightRequests == 0 { Thread.sleep(forTimeInterval: 0.005) }
            #expect(server.inFlightRequests == 1)
            server.shutdown()
            done.wait()
            let response = try #require(try result.withLock { $0 }?.get())
            #expect(response.status == 200)
            #expect(response.bodyText == "done")
            #expect(throws: HTTPClientError.self) {
                try CurlTransport().send(.init(url: base + "/items/1", timeout: .seconds(2)))
            }
        }
    }

    @Test("1,100 stalled connections from one address leave room for another address (per-address limit)")
    func oneAddressCannotHoldEveryConnection() throws {
        try withServer(
            demoRouter(),
            configure: {
                $0.connectionsPerAddress = 64
                $0.headerTimeoutSeconds = 0  // the per-address limit alone must hold
            }
        ) { server, _, _ in
            let port = Int(server.port)
            // Headers never finished: each would hold its connection until the idle timeout.
            var stalled: [RawConnection] = []
            for _ in 0..<1_100 {
                guard let connection = RawConnection(port: port, timeoutSeconds: 1) else { continue }
                connection.send("GET /items/1 HTTP/1.1\r\nHost: x\r\n")
                stalled.append(connection)
            }
            let other = try #require(RawConnection(port: port, source: "127.0.0.2", timeoutSeconds: 5))
            other.send("GET /items/2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            let answer = other.receive()
            #expect(answer.hasPrefix("HTTP/1.1 200"), "127.0.0.2 got: \(answer.prefix(80))")
            withExtendedLifetime(stalled) {}
        }
    }

    @Test("HTML escaping is per Unicode scalar; pages allow no form target and no base URL")
    func htmlEscaping() throws {
        #expect(HTMLPage.escape("\u{0600}<script>") == "\u{0600}&lt;script&gt;", "U+0600 and < are one Character")
        #expect(HTMLPage.escape("a\u{301}\"'&") == "a\u{301}&quot;&#39;&amp;")
        let page = HTMLPage.response(status: 400, title: "t", message: "\u{0600}<b>", link: nil)
        #expect(!String(decoding: page.body, as: UTF8.self).contains("<b>"))
        let policy = try #require(page.headers["Content-Security-Policy"])
        #expect(policy.contains("form-action 'none'") && policy.contains("base-uri 'none'"))
    }

    @Test("the per-address connection cap counts IPv6 per /64 and leaves trusted proxies alone")
    func connectionCapPerPrefix() throws {
        let cap = ConnectionCap(limit: 2, client: ClientAddress(trusted: [ClientAddress.Range("10.0.0.0/8")!]))
        cap.opened("2001:db8:1:2::1")
        cap.opened("2001:db8:1:2:ffff::9")
        #expect(!cap.admits("2001:db8:1:2::77"), "a third address of the same /64 is one host too many")
        #expect(cap.admits("2001:db8:1:3::1"), "the next /64 is someone else")
        cap.closed("2001:db8:1:2::1")
        #expect(cap.admits("2001:db8:1:2::77"))
        cap.opened("192.0.2.1")
        cap.opened("192.0.2.1")
        #expect(!cap.admits("192.0.2.1") && cap.admits("192.0.2.2"))
        for _ in 0..<5 { cap.opened("10.1.2.3") }
        #expect(cap.admits("10.1.2.3"), "a trusted proxy carries every client: not capped")
    }

    @Test("an over-limit chunked body gets its 413 at once and the connection closes, the rest unread")
    func chunkedBodyRefusedInMidBody() throws {
        // A long request deadline: the answer must not wait for it (before, the body was read
        // to its end and the attacker's unfinished one held the slot until the deadline).
        try withServer(
            demoRouter(),
            configure: {
                $0.maximumBodyBytes = 1024
                $0.headerTimeoutSeconds = 30
            }
        ) { server, _, metrics in
            let attacker = try #require(RawConnection(port: Int(server.port), timeoutSeconds: 5))
            let started = ContinuousClock.now
            attacker.send(
                "POST /items HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            attacker.send("800\r\n" + String(repeating: "a", count: 2048) + "\r\n")  // no last chunk: it never ends
            let answer = attacker.receive()
            #expect(answer.hasPrefix("HTTP/1.1 413 "), "\(answer.prefix(200))")
            #expect(answer.lowercased().contains("connection: close"))
            #expect(answer.contains("payload_too_large"))
            #expect(attacker.isClosedByPeer(), "the connection stayed open to read the rest")
            #expect(ContinuousClock.now - started < .seconds(3))
            // Its slot is freed and it was counted like any answer.
            let freed = ContinuousClock.now + .seconds(2)
            while server.inFlightRequests > 0 && ContinuousClock.now < freed { Thread.sleep(forTimeInterval: 0.02) }
            #expect(server.inFlightRequests == 0)
            #expect(metrics.render().contains("status=\"413\""))
        }
    }

    @Test("over TLS an over-limit chunked body gets its 413 through the TLS session")
    func chunkedBodyRefusedOverTLS() throws {
        let directory = TestFiles.path("http-tls")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let openssl = Process()
        openssl.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        openssl.arguments = [
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
            directory + "/key.pem", "-out", directory + "/cert.pem", "-days", "1", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ]
        openssl.standardError = FileHandle.nullDevice
        try openssl.run()
        openssl.waitUntilExit()
        let keyPEM = try String(contentsOfFile: directory + "/key.pem", encoding: .utf8)
        let certificatePEM = try String(contentsOfFile: directory + "/cert.pem", encoding: .utf8)
        try withServer(
            demoRouter(),
            configure: {
                $0.maximumBodyBytes = 1024
                $0.tls = (keyPEM, certificatePEM)
            }
        ) { server, _, _ in
            let client = CurlTransport(caCertificatesPath: directory + "/cert.pem")
            let response = try client.send(
                .init(
                    method: "POST", url: "https://127.0.0.1:\(server.port)/items",
                    headers: [("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")],
                    body: Array(repeating: UInt8(ascii: "a"), count: 4096)))
            #expect(response.status == 413)
            #expect(try problem(response)["code"] as? String == "payload_too_large")
        }
    }

    @Test("a client sending its headers a byte at a time is cut off at the header deadline")
    func headerDeadline() throws {
        try withServer(
            demoRouter(),
            configure: {
                $0.headerTimeoutSeconds = 1
                $0.connectionTimeoutSeconds = 30
            }
        ) { server, _, metrics in
            let port = Int(server.port)
            let slow = try #require(RawConnection(port: port, timeoutSeconds: 3))
            let started = ContinuousClock.now
            // A byte every 200 ms keeps libmicrohttpd's idle timer from ever firing.
            for byte in "GET /items/1 HTTP/1.1\r\nHost: xxxxxxxxxxxxxxxxxxxxxxx" {
                guard slow.send(String(byte)) else { break }
                Thread.sleep(forTimeInterval: 0.2)
                if ContinuousClock.now - started > .seconds(4) { break }
            }
            #expect(slow.isClosedByPeer(), "the connection outlived its header deadline")
            #expect(ContinuousClock.now - started < .seconds(6))
            #expect(metrics.render().contains("http_header_timeouts_total 1"))

            // A body trickled a byte at a time is cut off the same way, its slot freed.
            let trickle = try #require(RawConnection(port: port, timeoutSeconds: 3))
            trickle.send("POST /items HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
            let bodyStarted = ContinuousClock.now
            while ContinuousClock.now - bodyStarted < .seconds(4) {
                guard trickle.send("a") else { break }
                Thread.sleep(forTimeInterval: 0.2)
            }
            #expect(trickle.isClosedByPeer(), "the connection outlived its deadline while sending a body")
            #expect(ContinuousClock.now - bodyStarted < .seconds(6))
            let freed = ContinuousClock.now + .seconds(2)
            while server.inFlightRequests > 0 && ContinuousClock.now < freed { Thread.sleep(forTimeInterval: 0.02) }
            #expect(server.inFlightRequests == 0, "the trickled request's slot was not freed")

            // A kept-alive connection that sends whole requests is not affected.
            let steady = try #require(RawConnection(port: port, timeoutSeconds: 3))
            for index in 0..<3 {
                steady.send("GET /items/\(index) HTTP/1.1\r\nHost: x\r\n\r\n")
                #expect(steady.receive().hasPrefix("HTTP/1.1 200"))
                Thread.sleep(forTimeInterval: 0.6)
            }
        }
    }

    @Test("every response says nosniff; HSTS only over TLS")
    func securityHeaders() throws {
        try withServer(demoRouter()) { _, base, _ in
            for path in ["/items/1", "/nowhere"] {
                let response = try client.send(.init(url: base + path))
                #expect(response.header("x-content-type-options") == "nosniff")
                #expect(response.header("strict-transport-security") == nil)
            }
        }
    }

    @Test("rate limits: IPv6 counts by /64, and a flood of new keys does not reset a limited one")
    func rateLimiterKeys() throws {
        #expect(RateLimiter.addressKey("2001:db8:1:2:aaaa::1") == RateLimiter.addressKey("2001:db8:1:2:ffff:1:2:3"))
        #expect(RateLimiter.addressKey("2001:db8:1:2::1") != RateLimiter.addressKey("2001:db8:1:3::1"))
        #expect(RateLimiter.addressKey("::ffff:192.0.2.7") == "192.0.2.7")
        #expect(RateLimiter.addressKey("192.0.2.7") == "192.0.2.7")

        let limiter = RateLimiter(rate: 0.001, burst: 3, maximumKeys: 1_000)
        for _ in 0..<3 { #expect(limiter.acquire("victim") == nil) }
        #expect(limiter.acquire("victim") != nil)
        for index in 0..<5_000 { _ = limiter.acquire("flood-\(index)") }
        #expect(limiter.keyCount <= 1_000)
        #expect(limiter.acquire("victim") != nil, "the flood reset the victim's budget")

        let v6 = RateLimiter(rate: 0.001, burst: 2)
        #expect(throws: Never.self) { try v6.check(address: "2001:db8::1") }
        #expect(throws: Never.self) { try v6.check(address: "2001:db8::2") }
        #expect(throws: Problem.self) { try v6.check(address: "2001:db8::3") }
        #expect(throws: Never.self) { try v6.check(address: "2001:db8:0:1::3") }
    }

    @Test("behind trusted proxies the client is the right-most untrusted X-Forwarded-For address; budgets count it")
    func trustedProxies() throws {
        let trusted = ["127.0.0.0/8", "10.0.0.0/8", "2001:db8:ffff::/48"].compactMap(ClientAddress.Range.init)
        #expect(trusted.count == 3)
        #expect(ClientAddress.Range("10.0.0.0/33") == nil && ClientAddress.Range("nonsense") == nil)
        let proxies = ClientAddress(trusted: trusted)
        #expect(proxies.resolve(peer: "127.0.0.1", forwardedFor: ["198.51.100.7, 203.0.113.9, 10.1.2.3"]) == "203.0.113.9")
        #expect(proxies.resolve(peer: "127.0.0.1", forwardedFor: ["203.0.113.9", "10.1.2.3"]) == "203.0.113.9")
        #expect(
            proxies.resolve(peer: "192.0.2.1", forwardedFor: ["203.0.113.9"]) == "192.0.2.1",
            "an untrusted peer's header is ignored")
        #expect(
            proxies.resolve(peer: "127.0.0.1", forwardedFor: ["10.9.9.9, 10.1.2.3"]) == "10.9.9.9", "all trusted: the left-most")
        #expect(proxies.resolve(peer: "127.0.0.1", forwardedFor: ["203.0.113.9, junk, 10.1.2.3"]) == "10.1.2.3")
        #expect(proxies.resolve(peer: "127.0.0.1", forwardedFor: ["2001:db8:1::5, 2001:db8:ffff::1"]) == "2001:db8:1::5")
        #expect(ClientAddress().resolve(peer: "127.0.0.1", forwardedFor: ["203.0.113.9"]) == "127.0.0.1")

        // Live: the route's budget counts forwarded clients apart, the proxy itself not at all.
        var router = Router()
        router.group(AddressBudget(RateLimiter(rate: 0.001, burst: 2))) { router in
            router.get("/who") { request in .text(request.remoteAddress) }
        }
        try withServer(router, configure: { $0.trustedProxies = trusted }) { _, base, _ throws in
            let client = CurlTransport()
            func who(_ forwarded: String) throws -> (Int, String) {
                let response = try client.send(.init(url: base + "/who", headers: [("X-Forwarded-For", forwarded)]))
                return (response.status, String(decoding: response.body, as: UTF8.self))
            }
            #expect(try who("198.51.100.7, 203.0.113.9").1 == "203.0.113.9")
            #expect(try who("203.0.113.9").0 == 200)
            #expect(try who("203.0.113.9").0 == 429)
            #expect(try who("203.0.113.10") == (200, "203.0.113.10"), "another client behind the same proxy has its own budget")
        }
        try withServer(router) { _, base, _ in
            let response = try CurlTransport().send(.init(url: base + "/who", headers: [("X-Forwarded-For", "203.0.113.9")]))
            #expect(String(decoding: response.body, as: UTF8.self) == "127.0.0.1", "no trusted proxies: the header means nothing")
        }
    }

    @Test("a budget that charges only refusals never refuses what succeeds")
    func failuresOnlyBudget() throws {
        let limiter = RateLimiter(rate: 0.001, burst: 2)
        let handler = [AddressBudget(limiter, charge: .failures) as any HTTPMiddleware].wrapping { request in
            if request.path == "/junk" { throw Problem(status: 401, code: "unauthorized", title: "Unauthorized") }
            return .text("ok")
        }
        func status(_ path: String) -> Int {
            do { return try handler(HTTPRequest(method: .post, path: path)).status } catch {
                return (error as? Problem)?.status ?? 0
            }
        }
        #expect((0..<4).map { _ in status("/junk") } == [401, 401, 429, 429])
        #expect(status("/signed") == 200)
    }

    @Test("the default memory bound (connections × (pool + body + 4 KiB)) fits under half the Kubernetes memory limit")
    func memoryBoundFitsManifests() throws {
        let manifest = try Repository.text("deploy/kubernetes/deployment-api.yaml")
        let limit = try #require(manifest.firstMatch(of: /limits: \{memory: (\d+)Mi\}/)).output.1
        let bound = HTTPServer.Configuration().memoryBoundBytes
        #expect(bound == 1_024 * (48 + 64 + 4) * 1_024)
        #expect(bound <= Int(limit)! * 1_048_576 / 2, "the pod's limit leaves no room for the process itself")
    }

    @Test(
        "ambiguous framing (both length fields, a repeated, spaced or malformed Content-Length, another Transfer-Encoding) is 400 before any handler, and the connection closes"
    )
    func ambiguousFraming() throws {
        let handled = Atomic<Int>(0)
        var router = Router()
        router.get("/count") { _ in
            handled.add(1, ordering: .relaxed)
            return .text("counted")
        }
        router.post("/count") { _ in
            handled.add(1, ordering: .relaxed)
            return .text("counted")
        }
        // Each head is followed by a second request: a server that framed the first loosely would
        // answer it too, or take it for a body; a proxy framing it otherwise would forward it.
        let smuggled = "GET /count HTTP/1.1\r\nHost: x\r\n\r\n"
        let heads = [
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "Transfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n0\r\n\r\n",
            "Content-Length: 0\r\nContent-Length: \(smuggled.utf8.count)\r\n\r\n",
            "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
            "Content-Length : \(smuggled.utf8.count)\r\n\r\n",
            "Content-Length\t: \(smuggled.utf8.count)\r\n\r\n",
            "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ]
        // Malformed Content-Length values (a sign, a list, hex, trailing junk, none):
        // libmicrohttpd answers them itself (its own 400 page) before any handler, and closes.
        let malformed = [
            "Content-Length: +3\r\n\r\nabc", "Content-Length: 3, 3\r\n\r\nabc", "Content-Length: 0x3\r\n\r\nabc",
            "Content-Length: 3abc\r\n\r\nabc", "Content-Length: -1\r\n\r\n", "Content-Length: \r\n\r\n",
        ]
        try withServer(router) { server, url, metrics in
            for head in heads {
                let connection = try #require(RawConnection(port: Int(server.port), timeoutSeconds: 5))
                connection.send("POST /count HTTP/1.1\r\nHost: x\r\n" + head + smuggled)
                let answer = connection.receive()
                #expect(answer.hasPrefix("HTTP/1.1 400 "), "\(head.debugDescription): \(answer.prefix(120))")
                #expect(answer.contains("ambiguous_framing"), "\(head.debugDescription)")
                #expect(answer.lowercased().contains("connection: close"), "\(head.debugDescription)")
                #expect(!answer.contains("counted"), "\(head.debugDescription)")
                #expect(connection.isClosedByPeer(), "\(head.debugDescription): the connection stayed open")
            }
            for head in malformed {
                let connection = try #require(RawConnection(port: Int(server.port), timeoutSeconds: 5))
                connection.send("POST /count HTTP/1.1\r\nHost: x\r\n" + head + smuggled)
                let answer = connection.receive()
                #expect(answer.hasPrefix("HTTP/1.1 400 "), "\(head.debugDescription): \(answer.prefix(120))")
                #expect(!answer.contains("counted"), "\(head.debugDescription)")
                #expect(connection.isClosedByPeer(), "\(head.debugDescription): the connection stayed open")
            }
            #expect(handled.load(ordering: .relaxed) == 0, "no handler ran")
            #expect(metrics.render().contains("status=\"400\""))
            // Unambiguous requests are served, one after another on one connection.
            let connection = try #require(RawConnection(port: Int(server.port), timeoutSeconds: 5))
            connection.send("POST /count HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
            #expect(connection.receive().hasPrefix("HTTP/1.1 200 "))
            connection.send("POST /count HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
            #expect(connection.receive().hasPrefix("HTTP/1.1 200 "))
            #expect(handled.load(ordering: .relaxed) == 2)
            _ = url
        }
    }

    @Test("the framing rule: token field names, one length field of one kind, a length of digits only, chunked the only coding")
    func framingRule() {
        #expect(RequestFraming.problem([("Host", "x"), ("Content-Length", "3")]) == nil)
        #expect(RequestFraming.problem([("transfer-encoding", " chunked ")]) == nil)
        #expect(RequestFraming.problem([("Content-Length", "3"), ("Transfer-Encoding", "chunked")]) != nil)
        #expect(RequestFraming.problem([("Content-Length", "3"), ("content-length", "3")]) != nil)
        #expect(RequestFraming.problem([("Content-Length ", "3")]) != nil)
        #expect(RequestFraming.problem([("X-Note", "a b"), ("Bad\u{1}Name", "")]) != nil)
        #expect(RequestFraming.problem([("", "value")]) != nil)
        #expect(RequestFraming.problem([("Transfer-Encoding", "identity")]) != nil)
        #expect(RequestFraming.problem([("Content-Length", " 12\t")]) == nil)
        #expect(RequestFraming.problem([("TRANSFER-Encoding", "\tChunKed")]) == nil)
        // Only ASCII case folds: a KELVIN SIGN lowercases to "k" in Unicode, not in a token.
        #expect(RequestFraming.problem([("Transfer-Encoding", "chun\u{212A}ed")]) != nil)
        #expect(RequestFraming.problem([("Transfer-Encoding", "chunked, chunked")]) != nil)
        #expect(RequestFraming.problem([("Accept-Encoding", "gzip"), ("X-Request-ID", "a")]) == nil)
        for value in ["+3", "3, 3", "0x3", "3abc", "-1", "", " ", "٣", "1 2", "\u{00A0}3"] {
            #expect(RequestFraming.problem([("Content-Length", value)]) != nil, "\(value.debugDescription)")
        }
    }
}
