import BrokerCore
import Glibc
import HTTPClient

/// Which redirect URIs a client may register, and how a request's `redirect_uri` matches one
/// (RFC 9700 §4.1.3: exact string comparison; RFC 8252 for native apps).
package enum RedirectURIRule {
    /// Loopback hosts, whose port an app picks at run time (RFC 8252 §7.3).
    static let loopbackPrefixes = ["http://127.0.0.1", "http://[::1]", "http://localhost"]

    /// Why `uri` cannot be registered, or nil when it can. Private-use schemes
    /// (`com.example.app:/cb`, RFC 8252 §7.1) only for public clients: anyone can claim one.
    /// `privateNetworkHTTP`: the admin's per-client opt-in to plain http on a private-network
    /// host (a home lab's `http://192.168.1.20:8123/auth/callback`).
    static func refusal(_ uri: String, publicClient: Bool, privateNetworkHTTP: Bool = false) -> String? {
        guard uri.utf8.count <= ProviderPolicy.maximumRedirectURIBytes else { return "longer than 2048 bytes" }
        guard !uri.contains("#") else { return "a redirect URI has no fragment (RFC 6749 §3.1.2)" }
        guard !uri.contains("*") else { return "wildcards are not allowed" }
        if uri.hasPrefix("https://") || uri.hasPrefix("http://") {
            if URLRule.accepts(uri) { return nil }
            // The same URL syntax as https, to a host on a private network only.
            if privateNetworkHTTP, uri.hasPrefix("http://"), URLRule.accepts("https://" + uri.dropFirst(7)),
                let host = URLParts(uri)?.host, isPrivateNetworkHost(host)
            {
                return nil
            }
            return privateNetworkHTTP
                ? "https, or plain http only to loopback or a private-network host (RFC 1918, 100.64/10, "
                    + "*.home.arpa, *.local, *.lan, *.internal or a single-label name)"
                : "https, or plain http only to 127.0.0.1, [::1] or localhost "
                    + "(plain http to a private-network host needs the admin's private_network_http_redirects)"
        }
        guard let colon = uri.firstIndex(of: ":") else { return "not an absolute URI" }
        let scheme = uri[..<colon]
        // A reverse domain name (RFC 8252 §7.1): at least one dot, lower-case URI scheme characters.
        guard scheme.contains("."), scheme.first?.isLetter == true,
            scheme.allSatisfy({ ($0.isASCII && ($0.isLowercase || $0.isNumber)) || "+.-".contains($0) })
        else { return "scheme '\(scheme)' is neither https nor a private-use scheme such as com.example.app" }
        guard publicClient else { return "private-use schemes are for public clients (token_endpoint_auth_method none)" }
        guard uri.count > scheme.count + 1, !uri.contains(" ") else { return "the URI has no path" }
        return nil
    }

    /// Whether `presented` is one of `registered`: byte for byte, except that a loopback
    /// redirect matches on any port.
    static func matches(_ presented: String, _ registered: [String]) -> Bool {
        if registered.contains(presented) { return true }
        guard let stripped = withoutLoopbackPort(presented) else { return false }
        return registered.contains { withoutLoopbackPort($0) == stripped }
    }

    /// A loopback URL with its port removed, or nil for any other URL.
    static func withoutLoopbackPort(_ uri: String) -> String? {
        guard let prefix = loopbackPrefixes.first(where: { uri.hasPrefix($0) }) else { return nil }
        var rest = uri.dropFirst(prefix.count)
        if rest.first == ":" {
            rest = rest.dropFirst().drop { $0.isNumber }
        }
        guard rest.isEmpty || rest.first == "/" || rest.first == "?" else { return nil }
        return prefix + rest
    }

    /// Hosts of a private network: RFC 1918, CGNAT (100.64.0.0/10, as Tailscale uses), IPv6
    /// unique local literals, and names that no public DNS answers for: `*.home.arpa` (RFC
    /// 8375), `*.local` (mDNS), `*.lan`, `*.internal`, single-label names. A name is judged as
    /// written: the broker never connects to a redirect URI, the browser does.
    static func isPrivateNetworkHost(_ host: String) -> Bool {
        var v4 = in_addr()
        if inet_pton(AF_INET, host, &v4) == 1 {
            let b = withUnsafeBytes(of: v4) { Array($0) }
            switch (b[0], b[1]) {
            case (10, _), (172, 16...31), (192, 168), (100, 64...127): return true
            default: return false
            }
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, host, &v6) == 1 { return withUnsafeBytes(of: v6) { $0[0] & 0xfe == 0xfc } }
        let name = host.lowercased()
        guard name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == ".") }),
            !name.hasPrefix("."), !name.hasSuffix(".")
        else { return false }
        // A dotted all-numeric name is an address form, judged above or refused.
        if name.split(separator: ".").last?.allSatisfy(\.isNumber) == true { return false }
        return !name.contains(".") || [".home.arpa", ".local", ".lan", ".internal"].contains { name.hasSuffix($0) }
    }
}
