import Glibc

/// Who the client is when the broker sits behind proxies it trusts (`BROKER_TRUSTED_PROXIES`).
///
/// From a trusted peer the client is the right-most address of `X-Forwarded-For` that is not
/// itself a trusted proxy: every proxy appends the address it received from, so the entries
/// right of the first untrusted one were written by our own proxies, and everything left of
/// it by whoever the client is (and may be forged). From an untrusted peer the header is
/// ignored. With no trusted proxies the client is always the peer.
public struct ClientAddress: Sendable {
    /// A CIDR block, `192.0.2.0/24` or `2001:db8::/32` (a bare address is a /32 or /128).
    public struct Range: Sendable, Equatable, CustomStringConvertible {
        let network: [UInt8]
        let prefixLength: Int

        public init?(_ text: String) {
            let parts = text.split(separator: "/", omittingEmptySubsequences: false)
            guard (1...2).contains(parts.count), let bytes = ClientAddress.bytes(String(parts[0])) else { return nil }
            let bits = bytes.count * 8
            var length = bits
            if parts.count == 2 {
                guard let parsed = Int(parts[1]), (0...bits).contains(parsed), parts[1].allSatisfy(\.isASCII) else { return nil }
                length = parsed
            }
            network = Self.masked(bytes, length)
            prefixLength = length
        }

        public func contains(_ bytes: [UInt8]) -> Bool {
            bytes.count == network.count && Self.masked(bytes, prefixLength) == network
        }

        public var description: String { ClientAddress.text(network) + "/\(prefixLength)" }

        static func masked(_ bytes: [UInt8], _ length: Int) -> [UInt8] {
            bytes.enumerated().map { index, byte in
                let kept = min(8, max(0, length - index * 8))
                return kept == 8 ? byte : byte & ~(UInt8.max >> kept)
            }
        }
    }

    public let trusted: [Range]

    public init(trusted: [Range] = []) { self.trusted = trusted }

    /// The client of a request from `peer` carrying these `X-Forwarded-For` fields.
    public func resolve(peer: String, forwardedFor fields: [String]) -> String {
        guard !trusted.isEmpty, isTrusted(peer), !fields.isEmpty else { return peer }
        // Bounded by the request head's size (libmicrohttpd's connection memory).
        let hops = fields.flatMap { $0.split(separator: ",") }.map { $0.trimmingCharacters(in: " \t") }
        var client = peer
        for hop in hops.reversed() {
            // A hop that is not an address ends the walk: nothing left of it can be attributed.
            guard let bytes = Self.bytes(hop) else { return client }
            client = Self.text(bytes)
            if !trusted.contains(where: { $0.contains(bytes) }) { return client }
        }
        return client
    }

    func isTrusted(_ address: String) -> Bool {
        guard let bytes = Self.bytes(address) else { return false }
        return trusted.contains { $0.contains(bytes) }
    }

    /// An IPv4 or IPv6 address as 4 or 16 bytes (IPv4-mapped IPv6 as IPv4), nil otherwise.
    static func bytes(_ text: String) -> [UInt8]? {
        guard text.utf8.count <= 64 else { return nil }
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 { return withUnsafeBytes(of: v4) { Array($0) } }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, text, &v6) == 1 else { return nil }
        let octets = withUnsafeBytes(of: v6) { Array($0) }
        if octets[0..<10].allSatisfy({ $0 == 0 }) && octets[10] == 0xff && octets[11] == 0xff { return Array(octets[12...]) }
        return octets
    }

    static func text(_ bytes: [UInt8]) -> String {
        let family = bytes.count == 4 ? AF_INET : AF_INET6
        var buffer = [CChar](repeating: 0, count: 64)
        _ = bytes.withUnsafeBytes { inet_ntop(family, $0.baseAddress, &buffer, socklen_t(buffer.count)) }
        return String(decoding: buffer.prefix { $0 != 0 }.map(UInt8.init(bitPattern:)), as: UTF8.self)
    }
}

extension Substring {
    fileprivate func trimmingCharacters(in set: String) -> String {
        String(drop { set.contains($0) }.reversed().drop { set.contains($0) }.reversed())
    }
}
