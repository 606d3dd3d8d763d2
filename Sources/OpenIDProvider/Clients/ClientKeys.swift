import BrokerCore
import Foundation
import HTTPClient
import JOSE
import Locking
import Synchronization

/// The public keys a private_key_jwt client signs its assertions with: its registered `jwks`,
/// or its `jwks_uri` fetched under the outbound address rules (resolved and pinned to public
/// addresses unless BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS), at most 64 KiB, within 5 s, kept
/// for five minutes and fetched again sooner only for an unknown `kid` (at most every 30 s per
/// client). The cache holds at most `maximumEntries` clients (oldest dropped first).
final class ClientKeys: Sendable {
    let transport: any HTTPTransport
    let allowPrivateNetworks: Bool
    let resolver: ReceiverResolver
    static let maximumBytes = 64 * 1024
    static let freshFor: TimeInterval = 300
    static let refetchAfter: TimeInterval = 30
    static let maximumEntries = 1000
    private let cache = Lock<[String: Entry]>([:])

    struct Entry {
        let uri: String
        let keys: JWKSet
        let fetchedAt: Date
    }

    /// Why no key set could be had (the token endpoint answers invalid_client; the reason is logged, not sent).
    struct Unavailable: Error, CustomStringConvertible {
        let description: String
    }

    init(transport: any HTTPTransport, allowPrivateNetworks: Bool) {
        self.transport = transport
        self.allowPrivateNetworks = allowPrivateNetworks
        resolver = ReceiverResolver(timeout: .seconds(5))
    }

    /// The client's keys; `refresh` asks for a newer set (the assertion named an unknown kid).
    func keys(of client: ClientStore.Client, refresh: Bool = false) throws -> JWKSet {
        if let jwks = client.metadata.jwks { return try JWKSet(json: Array(jwks.utf8)) }
        guard let uri = client.metadata.jwksURI else { throw Unavailable(description: "no keys registered") }
        let now = Date()
        if let entry = cache.withLock({ $0[client.clientID] }), entry.uri == uri {
            let age = now.timeIntervalSince(entry.fetchedAt)
            if age < Self.freshFor && (!refresh || age < Self.refetchAfter) { return entry.keys }
        }
        let keys = try fetch(uri)
        cache.withLock { cache in
            if cache.count >= Self.maximumEntries, cache[client.clientID] == nil,
                let oldest = cache.min(by: { $0.value.fetchedAt < $1.value.fetchedAt })?.key
            {
                cache[oldest] = nil
            }
            cache[client.clientID] = Entry(uri: uri, keys: keys, fetchedAt: now)
        }
        return keys
    }

    private func fetch(_ uri: String) throws -> JWKSet {
        var request = HTTPClientRequest(
            method: "GET", url: uri, headers: [("Accept", "application/jwk-set+json, application/json")], body: [],
            timeout: .seconds(5))
        if !allowPrivateNetworks {
            guard let parts = URLParts(uri), parts.scheme == "https" else {
                throw Unavailable(description: "jwks_uri is not https")
            }
            do {
                request.pinnedAddresses = try resolver.publicAddresses(of: parts.host)
            } catch {
                throw Unavailable(description: "jwks_uri's host is not on a public address")
            }
        }
        let response: HTTPClientResponse
        do {
            response = try transport.send(request)
        } catch {
            throw Unavailable(description: "jwks_uri could not be fetched")
        }
        guard response.status == 200 else { throw Unavailable(description: "jwks_uri answered \(response.status)") }
        guard response.body.count <= Self.maximumBytes else { throw Unavailable(description: "jwks_uri's answer is too large") }
        do {
            return try JWKSet(json: response.body)
        } catch {
            throw Unavailable(description: "jwks_uri's answer is not a JWK Set")
        }
    }
}
