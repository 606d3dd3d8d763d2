import CMicroHTTPD
import Glibc
import Locking
import Synchronization

/// Simultaneous connections per client address (`connectionsPerAddress`), IPv6 counted per
/// /64 like the budgets (a host picks new addresses within its /64 at will; libmicrohttpd's
/// own per-IP limit counts each address apart). Trusted proxies are not capped: every
/// client behind them shares their address, and they cap their own clients.
final class ConnectionCap: Sendable {
    let limit: Int
    let client: ClientAddress
    private let open = Lock<[String: Int]>([:])

    init(limit: Int, client: ClientAddress) {
        self.limit = limit
        self.client = client
    }

    /// The key an address counts under, nil when it is not capped.
    func key(_ address: String) -> String? {
        client.isTrusted(address) ? nil : RateLimiter.addressKey(address)
    }

    /// Asked at accept. The count itself moves when libmicrohttpd reports the connection
    /// opened and closed, so a connection refused later (the global limit) is never counted.
    func admits(_ address: String) -> Bool {
        guard let key = key(address) else { return true }
        return open.withLock { ($0[key] ?? 0) < limit }
    }

    func opened(_ address: String) {
        guard let key = key(address) else { return }
        open.withLock { $0[key, default: 0] += 1 }
    }

    func closed(_ address: String) {
        guard let key = key(address) else { return }
        open.withLock { open in
            let left = (open[key] ?? 1) - 1
            open[key] = left > 0 ? left : nil
        }
    }
}

/// libmicrohttpd's accept policy: refuses an address at its cap (the socket is closed at once).
func serverAcceptPolicy(_ context: UnsafeMutableRawPointer?, _ address: UnsafePointer<sockaddr>?, _ length: socklen_t)
    -> MHD_Result
{
    guard let context, let address else { return .YES }
    let cap = Unmanaged<ConnectionCap>.fromOpaque(context).takeUnretainedValue()
    return cap.admits(socketAddressText(address)) ? .YES : .NO
}

/// The text of an IPv4 or IPv6 socket address, "" for any other family.
func socketAddressText(_ address: UnsafePointer<sockaddr>) -> String {
    var buffer = [CChar](repeating: 0, count: 64)
    switch Int32(address.pointee.sa_family) {
    case AF_INET:
        address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { v4 in
            var bytes = v4.pointee.sin_addr
            _ = inet_ntop(AF_INET, &bytes, &buffer, socklen_t(buffer.count))
        }
    case AF_INET6:
        address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { v6 in
            var bytes = v6.pointee.sin6_addr
            _ = inet_ntop(AF_INET6, &bytes, &buffer, socklen_t(buffer.count))
        }
    default:
        return ""
    }
    return String(decoding: buffer.prefix { $0 != 0 }.map(UInt8.init(bitPattern:)), as: UTF8.self)
}
