import Foundation
import HTTPClient
import HTTPServer
import Locking
import Synchronization

/// The origins a browser may call `/token`, `/userinfo` and `/revoke` from (single-page apps,
/// Fetch standard CORS): those of the registered redirect URIs, https and http alike as
/// registered; a loopback redirect URI allows its host on any port (RFC 8252 §7.3). Private-use
/// schemes have no origin. Read from the database at most every 10 seconds (and at once after
/// a registration or deletion on this replica): a preflight costs no query.
final class CORSOrigins: Sendable {
    let clients: ClientStore
    static let refreshInterval: TimeInterval = 10
    private let state = Lock<(origins: Set<String>, loadedAt: Date?)>((origins: [], loadedAt: nil))

    init(clients: ClientStore) { self.clients = clients }

    /// A registration or deletion happened: the next request reads the origins again.
    func changed() { state.withLock { $0.loadedAt = nil } }

    /// Whether `origin` (the request's `Origin` header) may read the answers.
    func allows(_ origin: String) -> Bool {
        guard origin.utf8.count <= 300, let normalized = Self.origin(of: origin, path: false) else { return false }
        let origins = current()
        if origins.contains(normalized) { return true }
        // Loopback: any port (the registered origin is kept without one).
        guard let loopback = Self.withoutPort(normalized), RedirectURIRule.loopbackPrefixes.contains(loopback) else {
            return false
        }
        return origins.contains(loopback)
    }

    private func current() -> Set<String> {
        let now = Date()
        if let fresh = state.withLock({ state -> Set<String>? in
            guard let loadedAt = state.loadedAt, now.timeIntervalSince(loadedAt) < Self.refreshInterval else { return nil }
            return state.origins
        }) {
            return fresh
        }
        // On a database failure the last known set serves (and is retried on the next request).
        guard let uris = try? clients.redirectURIs() else { return state.withLock { $0.origins } }
        var origins = Set<String>()
        for uri in uris {
            guard let origin = Self.origin(of: uri, path: true) else { continue }
            origins.insert(RedirectURIRule.withoutLoopbackPort(uri) != nil ? (Self.withoutPort(origin) ?? origin) : origin)
        }
        state.withLock { $0 = (origins, now) }
        return origins
    }

    /// `scheme://host[:port]` of an http(s) URL, lower-cased, default ports dropped (as
    /// browsers serialize an origin); nil for anything else. `path`: the URL may go on.
    static func origin(of url: String, path: Bool) -> String? {
        guard let parts = URLParts(url), parts.scheme == "https" || parts.scheme == "http" else { return nil }
        let lowered = url.lowercased()
        let afterScheme = lowered.dropFirst(parts.scheme.count + 3)
        let authority = afterScheme.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        // An Origin header is the bare origin; a redirect URI has a path after it.
        guard path || authority.count == afterScheme.count else { return nil }
        let host = parts.host.contains(":") ? "[\(parts.host)]" : parts.host
        let defaultPort = parts.scheme == "https" ? 443 : 80
        return parts.scheme + "://" + host + (parts.port == defaultPort ? "" : ":\(parts.port)")
    }

    static func withoutPort(_ origin: String) -> String? {
        guard let colon = origin.lastIndex(of: ":"), origin[origin.index(after: colon)...].allSatisfy(\.isNumber),
            !origin[colon...].hasPrefix("://")
        else { return origin }
        return String(origin[..<colon])
    }
}

/// CORS for the endpoints a browser app calls: the preflight (`OPTIONS`) is answered, and
/// allowed origins get `Access-Control-Allow-Origin` with that origin, never `*`, and never
/// `Access-Control-Allow-Credentials` (these endpoints take no cookies: the client
/// authenticates with PKCE, the access token travels in `Authorization`). `Vary: Origin` on
/// every answer, so a cache never hands one origin's answer to another.
struct CORSMiddleware: HTTPMiddleware {
    let origins: CORSOrigins
    /// The methods the route answers besides OPTIONS.
    let methods: String

    func handle(_ request: HTTPRequest, next: HTTPHandler) throws -> HTTPResponse {
        let origin = request.headers["Origin"]
        let allowed = origin.map(origins.allows) ?? false
        var response: HTTPResponse
        if request.method == .options {
            response = HTTPResponse(status: 204, headers: ["Cache-Control": "no-store"])
            if allowed {
                response.headers.set("Access-Control-Allow-Methods", methods)
                response.headers.set("Access-Control-Allow-Headers", "Authorization, Content-Type, DPoP")
                response.headers.set("Access-Control-Max-Age", "600")
            }
        } else {
            response = try next(request)
        }
        if allowed, let origin {
            response.headers.set("Access-Control-Allow-Origin", origin)
            response.headers.set("Access-Control-Expose-Headers", "WWW-Authenticate")
        }
        response.headers.set("Vary", "Origin")
        return response
    }
}
