import Glibc

/// A plain TCP connection to a loopback server from a chosen source address (127.0.0.2 is
/// another client as far as a per-address limit is concerned), for the attacks an HTTP
/// client library will not make: headers never finished, headers a byte at a time.
public final class RawConnection {
    public let descriptor: Int32

    /// Connects to `127.0.0.1:port` from `source`; nil when the connection is refused or
    /// not accepted within `timeoutSeconds`.
    public init?(port: Int, source: String = "127.0.0.1", timeoutSeconds: Int = 5) {
        descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { return nil }
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(descriptor, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        func address(_ host: String, _ port: Int) -> sockaddr_in {
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr(host)
            address.sin_port = UInt16(port).bigEndian
            return address
        }
        var local = address(source, 0)
        var remote = address("127.0.0.1", port)
        let size = socklen_t(MemoryLayout<sockaddr_in>.size)
        let connected =
            withUnsafePointer(to: &local) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, size) == 0 }
            }
            && withUnsafePointer(to: &remote) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, size) == 0 }
            }
        guard connected else {
            close(descriptor)
            return nil
        }
    }

    deinit { close(descriptor) }

    /// Sends `text`; false when the peer has gone.
    @discardableResult
    public func send(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        return bytes.withUnsafeBytes { Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } == bytes.count
    }

    /// Everything the server sends until it closes the connection or the timeout passes.
    public func receive() -> String {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = recv(descriptor, &buffer, buffer.count, 0)
            if count <= 0 { break }
            received += buffer.prefix(count)
            if let text = String(validating: received, as: UTF8.self), text.contains("\r\n\r\n"),
                !text.lowercased().contains("content-length") || text.split(separator: "\r\n\r\n", maxSplits: 1).count == 2
            {
                // A complete head; a short body follows in the same segment on loopback.
                if count < buffer.count { break }
            }
        }
        return String(decoding: received, as: UTF8.self)
    }

    /// True when the server has closed the connection (a read returns end of file) within the timeout.
    public func isClosedByPeer() -> Bool {
        var byte: UInt8 = 0
        return recv(descriptor, &byte, 1, 0) == 0
    }
}
