import Glibc

/// Which network addresses the broker may send a request to on someone else's say-so (a
/// webhook URL an API client chose): public unicast only. Loopback, private (RFC 1918, ULA),
/// link-local (cloud metadata at 169.254.169.254), CGNAT, unspecified, multicast, reserved,
/// benchmarking and documentation ranges are refused, and IPv4 inside IPv6 (mapped,
/// compatible, NAT64) is judged as the IPv4 address it carries.
public enum OutboundAddress {
    /// Why an address or host is refused.
    public struct Refusal: Error, Sendable, Equatable, CustomStringConvertible {
        /// The host does not resolve at all (rather than to an address that is not public).
        public var unresolvable = false
        public let description: String
    }

    /// True for a public unicast address: 4 bytes (IPv4) or 16 (IPv6).
    public static func isPublic(_ bytes: [UInt8]) -> Bool {
        if bytes.count == 4 { return isPublicIPv4(bytes) }
        guard bytes.count == 16 else { return false }
        let prefix = bytes[0..<12]
        if prefix.allSatisfy({ $0 == 0 }) { return false }  // ::, ::1 and IPv4-compatible ::a.b.c.d
        if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xff && bytes[11] == 0xff {
            return isPublicIPv4(Array(bytes[12...]))  // ::ffff:a.b.c.d
        }
        if bytes[0..<12] == [0x00, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0][...] {
            return isPublicIPv4(Array(bytes[12...]))  // 64:ff9b::/96 (NAT64)
        }
        if bytes[0] & 0xfe == 0xfc { return false }  // fc00::/7 unique local
        if bytes[0] == 0xfe && bytes[1] & 0xc0 == 0x80 { return false }  // fe80::/10 link-local
        if bytes[0] == 0xfe && bytes[1] & 0xc0 == 0xc0 { return false }  // fec0::/10 site-local (deprecated)
        if bytes[0] == 0xff { return false }  // multicast
        // 2001:db8::/32 documentation
        if bytes[0] == 0x20 && bytes[1] == 0x01 && bytes[2] == 0x0d && bytes[3] == 0xb8 { return false }
        if bytes[0] == 0x01 && bytes[1...7].allSatisfy({ $0 == 0 }) { return false }  // 100::/64 discard
        if bytes[0] == 0x20 && bytes[1] == 0x02 { return isPublicIPv4(Array(bytes[2..<6])) }  // 6to4 carries an IPv4
        return bytes[0] & 0xe0 == 0x20  // 2000::/3, global unicast
    }

    private static func isPublicIPv4(_ b: [UInt8]) -> Bool {
        switch (b[0], b[1]) {
        case (0, _), (10, _), (127, _): return false  // this network, private, loopback
        case (100, 64...127): return false  // CGNAT
        case (169, 254): return false  // link-local, cloud metadata
        case (172, 16...31), (192, 168): return false  // private
        case (192, 0) where b[2] == 0 || b[2] == 2: return false  // IETF protocol assignments, TEST-NET-1
        case (198, 18...19): return false  // benchmarking
        case (198, 51) where b[2] == 100, (203, 0) where b[2] == 113: return false  // TEST-NET-2, -3
        case (224...255, _): return false  // multicast, reserved, broadcast
        default: return true
        }
    }

    /// Checks a URL's host as written, before any lookup: `localhost` (and `*.localhost`) and
    /// numeric forms other than a dotted quad (`2130706433`, `0x7f.1`, `0177.0.0.1`, which
    /// resolvers read as addresses) are refused, as are literal addresses that are not public.
    /// Host names pass: they are checked when they are resolved, at every delivery.
    public static func checkHost(_ host: String) throws {
        let name = host.lowercased().trimmingSuffix(".")
        if name == "localhost" || name.hasSuffix(".localhost") {
            throw Refusal(description: "localhost is not a public address")
        }
        var v4 = in_addr()
        if inet_pton(AF_INET, name, &v4) == 1 {
            guard isPublic(withUnsafeBytes(of: v4) { Array($0) }) else {
                throw Refusal(description: "\(name) is not a public address")
            }
            return
        }
        // WHATWG URL: a host whose last label is a number is read as an IPv4 address.
        func isNumber(_ label: Substring) -> Bool {
            if label.hasPrefix("0x") { return label.dropFirst(2).allSatisfy(\.isHexDigit) }
            return !label.isEmpty && label.allSatisfy(\.isNumber)
        }
        if inet_aton(name, &v4) != 0 || name.split(separator: ".").last.map(isNumber) == true {
            throw Refusal(description: "numeric host forms other than a dotted quad are refused")
        }
        var v6 = in6_addr()
        let bare = name.hasPrefix("[") && name.hasSuffix("]") ? String(name.dropFirst().dropLast()) : name
        if inet_pton(AF_INET6, bare, &v6) == 1, !isPublic(withUnsafeBytes(of: v6) { Array($0) }) {
            throw Refusal(description: "\(bare) is not a public address")
        }
    }

    /// Every address `host` resolves to (getaddrinfo; blocks), as text, IPv6 without brackets.
    public static func resolve(_ host: String) throws -> [(text: String, bytes: [UInt8])] {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        guard getaddrinfo(bare, nil, &hints, &list) == 0, let list else {
            throw Refusal(unresolvable: true, description: "the host name does not resolve")
        }
        defer { freeaddrinfo(list) }
        func text(_ buffer: [CChar]) -> String {
            String(decoding: buffer.prefix { $0 != 0 }.map(UInt8.init(bitPattern:)), as: UTF8.self)
        }
        var addresses: [(String, [UInt8])] = []
        var entry: UnsafeMutablePointer<addrinfo>? = list
        while let current = entry {
            var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
            if current.pointee.ai_family == AF_INET {
                var address = current.pointee.ai_addr.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_addr }
                inet_ntop(AF_INET, &address, &buffer, socklen_t(buffer.count))
                addresses.append((text(buffer), withUnsafeBytes(of: address) { Array($0) }))
            } else if current.pointee.ai_family == AF_INET6 {
                var address = current.pointee.ai_addr.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                    $0.pointee.sin6_addr
                }
                inet_ntop(AF_INET6, &address, &buffer, socklen_t(buffer.count))
                addresses.append((text(buffer), withUnsafeBytes(of: address) { Array($0) }))
            }
            entry = current.pointee.ai_next
        }
        var seen = Set<String>()
        return addresses.filter { seen.insert($0.0).inserted }.map { (text: $0.0, bytes: $0.1) }
    }

    /// The addresses to pin a connection to `host` on: all of them public, or a refusal.
    public static func publicAddresses(of host: String) throws -> [String] {
        try checkHost(host)
        let resolved = try resolve(host)
        guard !resolved.isEmpty else { throw Refusal(unresolvable: true, description: "the host name does not resolve") }
        // One private answer refuses the host: a name that mixes them is a rebinding attempt.
        guard resolved.allSatisfy({ isPublic($0.bytes) }) else {
            throw Refusal(description: "the host name resolves to an address that is not public")
        }
        return resolved.map(\.text)
    }
}

extension String {
    fileprivate func trimmingSuffix(_ suffix: String) -> String { hasSuffix(suffix) ? String(dropLast(suffix.count)) : self }
}
