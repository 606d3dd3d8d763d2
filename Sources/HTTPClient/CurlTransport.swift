import CCurl
import CCurlShims
import Locking
import Synchronization

/// `HTTPTransport` on libcurl. Easy handles are pooled and reused, so keep-alive
/// connections to Apple and to webhook receivers survive between calls. Redirects are
/// never followed, only `http` and `https` are allowed, and response bodies are capped.
public final class CurlTransport: HTTPTransport {
    /// Largest response body accepted.
    public let maximumResponseBytes: Int
    /// A PEM file of CA certificates to trust instead of the system's (private CAs, tests).
    public let caCertificatesPath: String?
    private let idleHandles = Lock<[EasyHandle]>([])
    private let maximumIdleHandles: Int

    public init(maximumResponseBytes: Int = 1 << 20, maximumIdleHandles: Int = 32, caCertificatesPath: String? = nil) {
        _ = CurlGlobal.initialized
        self.maximumResponseBytes = maximumResponseBytes
        self.maximumIdleHandles = maximumIdleHandles
        self.caCertificatesPath = caCertificatesPath
    }

    public func send(_ request: HTTPClientRequest) throws -> HTTPClientResponse {
        let key = EasyHandle.pinKey(request)
        // A handle keeps what CURLOPT_RESOLVE put in its DNS cache, and its connections, after
        // the transfer (curl_easy_reset clears neither): it serves only requests that pin
        // every host:port it has pinned the same way (or pin nothing it has pinned), so no
        // pin is ever used by a request that did not ask for it, and keep-alive survives
        // deliveries to a receiver whose addresses did not change.
        let pooled = idleHandles.withLock { handles -> EasyHandle? in
            guard let index = handles.lastIndex(where: { $0.pins[key.hostPort] == key.addresses }) else { return nil }
            return handles.remove(at: index)
        }
        let handle = try pooled ?? EasyHandle()
        defer {
            idleHandles.withLock { handles in
                guard maximumIdleHandles > 0 else { return }  // keeps none (a one-shot caller)
                // The oldest goes: a handle whose pins no longer match anything would stay idle for ever.
                if handles.count >= maximumIdleHandles { handles.removeFirst() }
                handles.append(handle)
            }
        }
        return try handle.perform(request, maximumResponseBytes: maximumResponseBytes, caCertificatesPath: caCertificatesPath)
    }
}

/// `curl_global_init` is not thread-safe; a global's lazy initialiser runs exactly once.
enum CurlGlobal {
    static let initialized: Bool = curl_global_init(Int(CURL_GLOBAL_DEFAULT)) == CURLE_OK
}

/// Owns one `CURL` easy handle (libcurl: not thread-safe, one transfer at a time).
final class EasyHandle: @unchecked Sendable {
    private let handle: UnsafeMutableRawPointer
    /// host:port → the addresses pinned for it (as given to CURLOPT_RESOLVE), for every
    /// host:port this handle ever pinned: its DNS cache and connections remember them.
    private(set) var pins: [String: String] = [:]

    /// The host:port a request goes to and the addresses it pins (nil: none).
    static func pinKey(_ request: HTTPClientRequest) -> (hostPort: String, addresses: String?) {
        guard let url = URLParts(request.url) else { return ("", nil) }
        let addresses = request.pinnedAddresses.map { pinned in
            pinned.map { $0.contains(":") ? "[\($0)]" : $0 }.joined(separator: ",")
        }
        return ("\(url.host):\(url.port)", addresses)
    }

    init() throws {
        guard let handle = curl_easy_init() else {
            throw HTTPClientError(.other, "curl_easy_init failed")
        }
        self.handle = handle
    }

    deinit { curl_easy_cleanup(handle) }

    func perform(_ request: HTTPClientRequest, maximumResponseBytes: Int, caCertificatesPath: String?) throws
        -> HTTPClientResponse
    {
        curl_easy_reset(handle)
        let sink = ResponseSink(limit: maximumResponseBytes)
        let sinkPointer = Unmanaged.passUnretained(sink).toOpaque()
        var headerList: UnsafeMutablePointer<curl_slist>? = nil
        var resolveList: UnsafeMutablePointer<curl_slist>? = nil
        defer {
            curl_slist_free_all(headerList)
            curl_slist_free_all(resolveList)
        }
        for (name, value) in request.headers {
            headerList = curl_slist_append(headerList, "\(name): \(value)")
        }
        // An empty Expect header stops libcurl from waiting for "100 Continue" on POSTs.
        headerList = curl_slist_append(headerList, "Expect:")

        let milliseconds =
            Int(request.timeout.components.seconds) * 1000
            + Int(request.timeout.components.attoseconds / 1_000_000_000_000_000)
        var status = cbroker_curl_setopt_string(handle, CURLOPT_URL, request.url)
        status = status == CURLE_OK ? cbroker_curl_setopt_string(handle, CURLOPT_PROTOCOLS_STR, "http,https") : status
        _ = cbroker_curl_setopt_long(handle, CURLOPT_NOSIGNAL, 1)
        _ = cbroker_curl_setopt_long(handle, CURLOPT_FOLLOWLOCATION, 0)
        _ = cbroker_curl_setopt_long(handle, CURLOPT_TIMEOUT_MS, max(1, milliseconds))
        _ = cbroker_curl_setopt_long(handle, CURLOPT_CONNECTTIMEOUT_MS, max(1, min(milliseconds, 5000)))
        _ = cbroker_curl_setopt_off_t(handle, CURLOPT_MAXFILESIZE_LARGE, Int64(maximumResponseBytes))
        _ = cbroker_curl_setopt_ptr(handle, CURLOPT_HTTPHEADER, UnsafeMutableRawPointer(headerList))
        _ = cbroker_curl_setopt_write_function(handle, CURLOPT_WRITEFUNCTION, curlWriteBody)
        _ = cbroker_curl_setopt_ptr(handle, CURLOPT_WRITEDATA, sinkPointer)
        _ = cbroker_curl_setopt_write_function(handle, CURLOPT_HEADERFUNCTION, curlWriteHeader)
        _ = cbroker_curl_setopt_ptr(handle, CURLOPT_HEADERDATA, sinkPointer)
        if let caCertificatesPath { _ = cbroker_curl_setopt_string(handle, CURLOPT_CAINFO, caCertificatesPath) }
        if let pinned = request.pinnedAddresses {
            // host:port:address,… (IPv6 in brackets) replaces whatever the handle's DNS cache
            // holds for host:port; TLS still verifies the certificate against the host name.
            let key = Self.pinKey(request)
            guard !pinned.isEmpty, !key.hostPort.isEmpty, let addresses = key.addresses else {
                throw HTTPClientError(.invalidURL, "unusable URL")
            }
            pins[key.hostPort] = addresses
            resolveList = curl_slist_append(resolveList, "\(key.hostPort):\(addresses)")
            _ = cbroker_curl_setopt_ptr(handle, CURLOPT_RESOLVE, UnsafeMutableRawPointer(resolveList))
            // Nothing but the pinned addresses: no proxy from the environment either.
            _ = cbroker_curl_setopt_string(handle, CURLOPT_NOPROXY, "*")
        }
        guard status == CURLE_OK else { throw HTTPClientError(.invalidURL, "unusable URL") }

        let code: CURLcode = request.body.withUnsafeBytes { body in
            switch request.method {
            case "GET":
                _ = cbroker_curl_setopt_long(handle, CURLOPT_HTTPGET, 1)
            case "HEAD":
                _ = cbroker_curl_setopt_long(handle, CURLOPT_NOBODY, 1)
            default:
                _ = cbroker_curl_setopt_long(handle, CURLOPT_POST, 1)
                _ = cbroker_curl_setopt_off_t(handle, CURLOPT_POSTFIELDSIZE_LARGE, Int64(body.count))
                // COPYPOSTFIELDS makes libcurl copy the body, so it need not outlive this closure.
                if let bytes = body.baseAddress, body.count > 0 {
                    _ = cbroker_curl_setopt_ptr(handle, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: bytes))
                } else {
                    _ = cbroker_curl_setopt_string(handle, CURLOPT_COPYPOSTFIELDS, "")
                }
                if request.method != "POST" {
                    _ = cbroker_curl_setopt_string(handle, CURLOPT_CUSTOMREQUEST, request.method)
                }
            }
            return withExtendedLifetime(sink) { curl_easy_perform(handle) }
        }
        guard code == CURLE_OK else { throw Self.error(code, sink: sink) }
        var responseCode = 0
        _ = cbroker_curl_getinfo_long(handle, CURLINFO_RESPONSE_CODE, &responseCode)
        return HTTPClientResponse(status: responseCode, headers: sink.headers, body: sink.body)
    }

    private static func error(_ code: CURLcode, sink: ResponseSink) -> HTTPClientError {
        let text = String(cString: curl_easy_strerror(code))
        switch code {
        case CURLE_OPERATION_TIMEDOUT: return HTTPClientError(.timeout, text)
        case CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_HOST: return HTTPClientError(.connectionFailed, text)
        case CURLE_GOT_NOTHING, CURLE_RECV_ERROR, CURLE_SEND_ERROR, CURLE_PARTIAL_FILE:
            return HTTPClientError(.connectionClosed, text)
        case CURLE_FILESIZE_EXCEEDED: return HTTPClientError(.responseTooLarge, text)
        case CURLE_WRITE_ERROR where sink.overflowed: return HTTPClientError(.responseTooLarge, text)
        case CURLE_URL_MALFORMAT, CURLE_UNSUPPORTED_PROTOCOL: return HTTPClientError(.invalidURL, text)
        default: return HTTPClientError(.other, text)
        }
    }
}

/// The host and port of an absolute http(s) URL, as libcurl's CURLOPT_RESOLVE names them.
public struct URLParts: Sendable, Equatable {
    public var scheme: String
    /// Without brackets for IPv6.
    public var host: String
    public var port: Int

    public init?(_ url: String) {
        let lowered = url.prefix(8).lowercased()
        let schemeLength = lowered.hasPrefix("https://") ? 5 : lowered.hasPrefix("http://") ? 4 : 0
        guard schemeLength > 0 else { return nil }
        scheme = String(lowered.prefix(schemeLength))
        let rest = url.dropFirst(schemeLength + 3)
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        guard !authority.contains("@"), !authority.isEmpty else { return nil }
        var hostPart = Substring(authority)
        var portText: Substring?
        if authority.hasPrefix("[") {
            guard let close = authority.firstIndex(of: "]") else { return nil }
            hostPart = authority[authority.index(after: authority.startIndex)..<close]
            let after = authority[authority.index(after: close)...]
            if after.hasPrefix(":") { portText = after.dropFirst() } else if !after.isEmpty { return nil }
        } else if let colon = authority.lastIndex(of: ":") {
            hostPart = authority[..<colon]
            portText = authority[authority.index(after: colon)...]
        }
        host = String(hostPart).lowercased()
        if let portText {
            guard let value = Int(portText), (1...65_535).contains(value) else { return nil }
            port = value
        } else {
            port = scheme == "https" ? 443 : 80
        }
    }
}

/// Collects one response's headers and body from libcurl's callbacks.
final class ResponseSink {
    let limit: Int
    var body: [UInt8] = []
    var headers: [(String, String)] = []
    var overflowed = false

    init(limit: Int) { self.limit = limit }
}

private func curlWriteBody(
    _ data: UnsafeMutablePointer<CChar>, _ size: Int, _ count: Int, _ context: UnsafeMutableRawPointer?
) -> Int {
    guard let context else { return 0 }
    let sink = Unmanaged<ResponseSink>.fromOpaque(context).takeUnretainedValue()
    let length = size * count
    if sink.body.count + length > sink.limit {
        sink.overflowed = true
        return 0  // Anything but `length` aborts the transfer.
    }
    data.withMemoryRebound(to: UInt8.self, capacity: length) {
        sink.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: length))
    }
    return length
}

private func curlWriteHeader(
    _ data: UnsafeMutablePointer<CChar>, _ size: Int, _ count: Int, _ context: UnsafeMutableRawPointer?
) -> Int {
    guard let context else { return 0 }
    let sink = Unmanaged<ResponseSink>.fromOpaque(context).takeUnretainedValue()
    let length = size * count
    let line = data.withMemoryRebound(to: UInt8.self, capacity: length) {
        String(decoding: UnsafeBufferPointer(start: $0, count: length), as: UTF8.self)
    }
    if line.hasPrefix("HTTP/") {
        sink.headers.removeAll()  // A new response (after 100 Continue): start over.
    } else if let colon = line.firstIndex(of: ":") {
        let name = line[..<colon].lowercased()
        let value = line[line.index(after: colon)...].trimmingWhitespace()
        sink.headers.append((name, value))
    }
    return length
}

extension StringProtocol {
    /// Drops spaces, tabs, CR and LF at both ends (by scalar: "\r\n" is one Character).
    fileprivate func trimmingWhitespace() -> String {
        let whitespace: Set<Unicode.Scalar> = [" ", "\t", "\r", "\n"]
        var scalars = Substring(self).unicodeScalars[...]
        while let first = scalars.first, whitespace.contains(first) { scalars.removeFirst() }
        while let last = scalars.last, whitespace.contains(last) { scalars.removeLast() }
        return String(String.UnicodeScalarView(scalars))
    }
}
