import Foundation

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// A client for appleid-broker's HTTP API, for Swift app backends (Vapor, Hummingbird, …):
/// typed calls for login, users, credential state, deletions and the event feed, over
/// Foundation's `URLSession`, with the broker's problems as `BrokerProblem`.
///
/// ```swift
/// let broker = AppleIDBrokerClient(baseURL: URL(string: "http://appleid-broker")!, apiKey: key)
/// let login = try await broker.login(.init(identityToken: token, authorizationCode: code, rawNonce: rawNonce))
/// ```
public struct AppleIDBrokerClient: Sendable {
    public let baseURL: URL
    private let apiKey: String
    private let session: URLSession

    /// - Parameters:
    ///   - baseURL: where the broker listens (`http://127.0.0.1:8080`).
    ///   - apiKey: an API key (`abk_…`) with the scopes of the calls you make.
    public init(baseURL: URL, apiKey: String, session: URLSession = .shared) {
        self.baseURL = baseURL
        self.apiKey = apiKey
        self.session = session
    }

    // MARK: Login (scope `login`)

    /// `POST /v1/apple/login`: verifies the identity token, exchanges the code, upserts the user.
    public func login(_ request: LoginRequest) async throws -> LoginResponse {
        try await send("POST", "/v1/apple/login", body: request)
    }

    /// `POST /v1/apple/web/redeem`: the login answer of a web sign-in's result code, once.
    public func redeemWebSignIn(resultCode: String) async throws -> LoginResponse {
        try await send("POST", "/v1/apple/web/redeem", body: ["result_code": resultCode])
    }

    // MARK: Users (scope `read`)

    /// `GET /v1/users/{id}`. A deleted user is `BrokerProblem` 410 `user_deleted`.
    public func user(_ id: String) async throws -> User {
        try await send("GET", "/v1/users/\(try Self.segment(id))")
    }

    /// `GET /v1/users/{id}/credential-state`, for one app (its client id) or any.
    public func credentialState(userID: String, clientID: String? = nil) async throws -> CredentialState {
        let query = clientID.map { [URLQueryItem(name: "client_id", value: $0)] } ?? []
        let answer: CredentialStateAnswer = try await send(
            "GET", "/v1/users/\(try Self.segment(userID))/credential-state", query: query)
        return answer.state
    }

    // MARK: Deletions (scope `compliance`)

    /// `POST /v1/deletions`: cascaded deletion, revoking at Apple first.
    public func requestDeletion(_ request: DeletionRequest) async throws -> DeletionAccepted {
        try await send("POST", "/v1/deletions", body: request)
    }

    /// `GET /v1/deletions/{id}`.
    public func deletion(_ id: String) async throws -> Deletion {
        try await send("GET", "/v1/deletions/\(try Self.segment(id))")
    }

    // MARK: Events (scope `events`)

    /// `GET /v1/events`: the page after `cursor` (nil: from the start). Keep `nextCursor`.
    public func events(after cursor: String? = nil, limit: Int = 100) async throws -> EventPage {
        var query = [URLQueryItem(name: "limit", value: String(limit))]
        if let cursor { query.append(URLQueryItem(name: "after", value: cursor)) }
        return try await send("GET", "/v1/events", query: query)
    }

    // MARK: Transport

    private static let encoder = JSONEncoder()
    private static let decoder: JSONDecoder = {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .custom { decoder in
            let text = try decoder.singleValueContainer().decode(String.self)
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            if let date = formatter.date(from: text) { return date }
            formatter.formatOptions = [.withInternetDateTime]
            if let date = formatter.date(from: text) { return date }
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "not RFC 3339: \(text)"))
        }
        return decoder
    }()

    private struct Empty: Encodable {}

    private func send<Answer: Decodable>(_ method: String, _ path: String, query: [URLQueryItem] = []) async throws -> Answer {
        try await send(method, path, query: query, body: Optional<Empty>.none)
    }

    private func send<Answer: Decodable, Body: Encodable>(
        _ method: String, _ path: String, query: [URLQueryItem] = [], body: Body?
    ) async throws -> Answer {
        guard var components = URLComponents(url: baseURL.appendingPathComponent(path), resolvingAgainstBaseURL: false) else {
            throw BrokerProblem(status: 0, code: "invalid_url", title: "Invalid URL", detail: path)
        }
        if !query.isEmpty { components.queryItems = query }
        guard let url = components.url else {
            throw BrokerProblem(status: 0, code: "invalid_url", title: "Invalid URL", detail: path)
        }
        var request = URLRequest(url: url)
        request.httpMethod = method
        request.setValue("Bearer \(apiKey)", forHTTPHeaderField: "Authorization")
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        if let body {
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
            request.httpBody = try Self.encoder.encode(body)
        }
        let (data, response) = try await session.data(for: request)
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        guard (200..<300).contains(status) else {
            throw (try? Self.decoder.decode(BrokerProblem.self, from: data))
                ?? BrokerProblem(status: status, code: "http_\(status)", title: "Unexpected answer", detail: nil)
        }
        return try Self.decoder.decode(Answer.self, from: data)
    }

    /// A path segment: ids are UUIDs, so anything else is refused before it reaches a URL.
    private static func segment(_ id: String) throws -> String {
        guard UUID(uuidString: id) != nil else {
            throw BrokerProblem(status: 0, code: "invalid_id", title: "Invalid id", detail: "ids are UUIDs")
        }
        return id.lowercased()
    }
}

/// An RFC 9457 problem the broker answered with: switch on `code` (stable, documented in
/// the broker's OpenAPI description), never on `title` or `detail`.
public struct BrokerProblem: Error, Sendable, Equatable, Decodable, CustomStringConvertible {
    public var status: Int
    public var code: String
    public var title: String
    public var detail: String?
    /// `Retry-After` is in the headers; the problem body carries the deletion id of a 409/410.
    public var deletionID: String?

    public init(status: Int, code: String, title: String, detail: String?, deletionID: String? = nil) {
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.deletionID = deletionID
    }

    enum CodingKeys: String, CodingKey {
        case status, code, title, detail
        case deletionID = "deletion_id"
    }

    public var description: String { "\(status) \(code): \(detail ?? title)" }
}
