import BrokerCore

/// Which redirect URIs a client may register, and how a request's `redirect_uri` matches one
/// (RFC 9700 §4.1.3: exact string comparison; RFC 8252 for native apps).
package enum RedirectURIRule {
    /// Loopback hosts, whose port an app picks at run time (RFC 8252 §7.3).
    static let loopbackPrefixes = ["http://127.0.0.1", "http://[::1]", "http://localhost"]

    /// Why `uri` cannot be registered, or nil when it can. Private-use schemes
    /// (`com.example.app:/cb`, RFC 8252 §7.1) only for public clients: anyone can claim one.
    static func refusal(_ uri: String, publicClient: Bool) -> String? {
        guard uri.utf8.count <= ProviderPolicy.maximumRedirectURIBytes else { return "longer than 2048 bytes" }
        guard !uri.contains("#") else { return "a redirect URI has no fragment (RFC 6749 §3.1.2)" }
        guard !uri.contains("*") else { return "wildcards are not allowed" }
        if uri.hasPrefix("https://") || uri.hasPrefix("http://") {
            return URLRule.accepts(uri) ? nil : "https, or plain http only to 127.0.0.1, [::1] or localhost"
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
}
