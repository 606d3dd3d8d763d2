import BrokerCore
import Foundation
import HTTPServer
import PostgresClient

/// The path and query parameters several routes share, refused with the same codes.
extension HTTPRequest {
    /// A UUID path parameter; `invalid` (e.g. `invalid_user_id`) when it is not one.
    func uuidParameter(_ name: String, invalid code: BrokerError.Code, naming what: String) throws -> UUID {
        guard let id = UUID(canonicalText: try parameter(name)) else { throw BrokerError(code, "the \(what) must be a UUID") }
        return id
    }

    /// `?limit=`: 1…1000, `defaultLimit` when absent.
    func limitParameter(default defaultLimit: Int = 100) throws -> Int {
        guard let text = query["limit"] else { return defaultLimit }
        guard let limit = Int(text), (1...1000).contains(limit) else { throw BrokerError.invalidRequest("limit must be 1…1000") }
        return limit
    }

    /// `?state=` when it is one of `T`'s raw values, nil when absent.
    func stateParameter<T: RawRepresentable & CaseIterable>(_ type: T.Type) throws -> T? where T.RawValue == String {
        guard let text = query["state"] else { return nil }
        guard let state = T(rawValue: text) else {
            throw BrokerError.invalidRequest("state must be one of \(T.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        return state
    }
}
