import BrokerCrypto
import Foundation
import PostgresClient
import StrictJSON

/// Opens deletion requests for the compliance API and the CLI.
package struct DeletionService: Sendable {
    package let store: DeletionStore
    /// Wakes the deletion job in this process (others are woken by NOTIFY).
    package let wake: @Sendable () -> Void
    /// Where handed-over authorization codes may come from, and how they are sealed; nil
    /// refuses requests carrying one.
    package var codes: CodeIntake?

    /// Exchanges a handed-over code at once (deletion id, user id), before the job is woken, for
    /// a new request and an open one alike: Apple's codes live five minutes, the queue may be
    /// slower. nil: the job does it.
    package var exchangeCode: (@Sendable (UUID, UUID) throws -> Void)?

    package init(
        store: DeletionStore, wake: @escaping @Sendable () -> Void = {}, codes: CodeIntake? = nil,
        exchangeCode: (@Sendable (UUID, UUID) throws -> Void)? = nil
    ) {
        self.store = store
        self.wake = wake
        self.codes = codes
        self.exchangeCode = exchangeCode
    }

    /// Checks and seals the authorization code a request may carry (§10.3).
    package struct CodeIntake: Sendable {
        package let tokenKeys: TokenKeyRing
        package let clientIDs: Set<String>
        /// `APPLE_REDIRECT_URIS`, and the broker's own web callback for its Services IDs.
        package let redirectURIs: [String: Set<String>]
        package let webCallbackURL: String?

        package init(
            tokenKeys: TokenKeyRing, clientIDs: Set<String>, redirectURIs: [String: Set<String>], webCallbackURL: String?
        ) {
            self.tokenKeys = tokenKeys
            self.clientIDs = clientIDs
            self.redirectURIs = redirectURIs
            self.webCallbackURL = webCallbackURL
        }

        package func seal(_ request: Request, userID: UUID) throws -> DeletionStore.SealedCode? {
            guard let code = request.authorizationCode else { return nil }
            if let clientID = request.clientID, !clientIDs.contains(clientID) {
                throw BrokerError(.invalidClientID, "client_id must be one of APPLE_CLIENT_IDS")
            }
            if let redirectURI = request.redirectURI {
                guard let clientID = request.clientID else {
                    throw BrokerError.invalidRequest(
                        "field `redirect_uri` needs `client_id`: the client id the web code was issued to")
                }
                guard redirectURI == webCallbackURL || redirectURIs[clientID]?.contains(redirectURI) == true else {
                    throw BrokerError(
                        .redirectURINotRegistered,
                        "redirect_uri is not one of the Return URLs registered for this client id (APPLE_REDIRECT_URIS)")
                }
            }
            let sealed = try tokenKeys.seal(
                Array(code.utf8), associatedData: DeletionStore.SealedCode.associatedData(userID: userID))
            return .init(sealed: sealed.sealed, keyID: sealed.keyID, clientID: request.clientID, redirectURI: request.redirectURI)
        }
    }

    package struct Request {
        package var target: DeletionStore.Target
        package var reason: String
        package var requestedBy: String
        /// A fresh authorization code (the app re-authenticated the user to delete the
        /// account): the job exchanges it and revokes what it yields.
        package var authorizationCode: String?
        /// The client id the code was issued to; nil: the one the user signed in with last.
        package var clientID: String?
        /// The `redirect_uri` of a web code.
        package var redirectURI: String?

        package init(
            target: DeletionStore.Target, reason: String, requestedBy: String, authorizationCode: String? = nil,
            clientID: String? = nil, redirectURI: String? = nil
        ) {
            self.target = target
            self.reason = reason
            self.requestedBy = requestedBy
            self.authorizationCode = authorizationCode
            self.clientID = clientID
            self.redirectURI = redirectURI
        }

        package init(_ body: JSONObjectReader) throws {
            let userID = try body.string("user_id")
            let appleSub = try body.string("apple_sub")
            switch (userID, appleSub) {
            case (let userID?, nil):
                guard let id = UUID(canonicalText: userID) else {
                    throw BrokerError(.invalidUserID, "the user id must be a UUID")
                }
                target = .user(id)
            case (nil, let sub?):
                guard !sub.isEmpty, sub.utf8.count <= 256 else {
                    throw BrokerError.invalidRequest("field `apple_sub` is invalid")
                }
                target = .appleSub(sub)
            default:
                throw BrokerError.invalidRequest("give exactly one of `user_id` and `apple_sub`")
            }
            reason = try body.requiredString("reason")
            requestedBy = try body.requiredString("requested_by")
            guard !reason.isEmpty, reason.utf8.count <= 500 else {
                throw BrokerError.invalidRequest("field `reason` must be 1…500 bytes")
            }
            guard !requestedBy.isEmpty, requestedBy.utf8.count <= 200 else {
                throw BrokerError.invalidRequest("field `requested_by` must be 1…200 bytes")
            }
            authorizationCode = try body.string("authorization_code")
            clientID = try body.string("client_id")
            redirectURI = try body.string("redirect_uri")
            for (field, value, limit) in [
                ("authorization_code", authorizationCode, 2048), ("client_id", clientID, 256),
                ("redirect_uri", redirectURI, 2048),
            ] {
                if let value, value.isEmpty || value.utf8.count > limit {
                    throw BrokerError.invalidRequest("field `\(field)` must be 1…\(limit) bytes")
                }
            }
            if authorizationCode == nil && (clientID != nil || redirectURI != nil) {
                throw BrokerError.invalidRequest("fields `client_id` and `redirect_uri` go with `authorization_code`")
            }
            if redirectURI != nil && clientID == nil {
                throw BrokerError.invalidRequest(
                    "field `redirect_uri` needs `client_id`: the client id the web code was issued to")
            }
        }
    }

    /// Opens the request (or returns the open one). 404 for an unknown user, 410 with the
    /// original deletion id for a user already deleted.
    /// - Parameter key: the API key asking; a key limited to some apps finds only their users,
    ///   and gets 403 `user_shared_with_other_apps` for a user other apps share.
    package func request(
        _ request: Request, source: DeletionSource, actor: String, visibleTo key: APIKey? = nil
    ) throws -> (id: UUID, state: DeletionState, created: Bool) {
        var request = request
        if let key, let reach = key.reach, request.authorizationCode != nil {
            // A code goes to Apple under the client id it names: a limited key hands over codes of
            // its own apps only (issue 38, item 8), checked before anything is written or sent.
            if let clientID = request.clientID {
                guard reach.contains(clientID) else { throw BrokerError.clientNotAllowed(clientID) }
            } else if reach.count == 1 {
                // Not the user's last client id, which may be another app's.
                request.clientID = reach.first
            } else {
                throw BrokerError.invalidRequest(
                    "field `client_id` is required with `authorization_code` for an API key limited to several apps")
            }
        }
        for _ in 0..<2 {
            let resolution = try store.resolve(request.target)
            if let key {
                switch resolution {
                case .user(let id) where try !AppReach.user(id, visibleTo: key, pool: store.pool): throw BrokerError.userNotFound
                case .user(let id) where try AppReach.user(id, sharedBeyond: key, pool: store.pool):
                    // A deletion removes the whole account and revokes every app's grant at Apple:
                    // one app of several must not trigger it (issue 29, item 3).
                    throw BrokerError(
                        .userSharedWithOtherApps,
                        "this user also uses apps outside this API key's client ids; deleting the account ends it for"
                            + " every app, so it needs a key that reaches all of them (or `appleid-broker delete-user`)")
                case .deleted(let id) where try !AppReach.deletion(id, visibleTo: key, pool: store.pool):
                    throw BrokerError.userNotFound
                default: break
                }
            }
            switch resolution {
            case .notFound:
                throw BrokerError.userNotFound
            case .deleted(let deletionID):
                throw BrokerError.userDeleted("this user was already deleted", deletionID: deletionID.lowercasedString)
            case .user(let userID):
                let code: DeletionStore.SealedCode?
                if request.authorizationCode != nil {
                    guard let codes else {
                        throw BrokerError.invalidRequest(
                            "this command cannot take an authorization code (TOKEN_ENCRYPTION_KEY unset)")
                    }
                    code = try codes.seal(request, userID: userID)
                } else {
                    code = nil
                }
                guard
                    let opened = try store.request(
                        userID: userID, source: source, reason: request.reason, requestedBy: request.requestedBy, code: code,
                        exchangeLease: exchangeCode == nil ? nil : HandedOverCode.requestLease)
                else { continue }  // Purged between the two queries: resolve again.
                if let state = opened.codeRefusedIn {
                    // Never 202 with the code dropped: the caller learns it was not used, and why.
                    throw BrokerError(
                        .deletionCodeRefused,
                        state == .failed
                            ? "this user's deletion failed and waits for a retry (POST /v1/deletions/{id}/retry); the code was"
                                + " not used: send it again once the deletion is retried, within its five minutes"
                            : "this user's deletion has finished revoking at Apple; the code was not used",
                        extensions: ["deletion_id": opened.id.lowercasedString, "state": state.rawValue])
                }
                if code != nil, let exchangeCode {
                    // At once, for a request already open too. A failure here (the database) leaves the code to the job.
                    try? exchangeCode(opened.id, userID)
                }
                if opened.created || code != nil { wake() }
                let state = try store.record(opened.id)?.state ?? .requested
                return (opened.id, state, opened.created)
            }
        }
        throw BrokerError.userNotFound
    }

    /// Queues a failed request again as new (audited as `deletion.retried` by `actor`) and wakes
    /// the job; false when the request is not `failed`.
    package func retry(_ id: UUID, by actor: String) throws -> Bool {
        guard try store.retry(id, by: actor) else { return false }
        wake()
        return true
    }

    // MARK: What operators note (the console's deletion actions)

    /// Records when and through which ticket a request the console opened was received (the
    /// deadline runs from then), with the console's audit entry.
    package func annotate(_ id: UUID, receivedAt: Date, ticket: String, audit: AuditLog.Record) throws {
        try store.annotate(id, receivedAt: receivedAt, ticket: ticket, audit: audit)
    }

    /// Extends a request's deadline to `until` with `reason` (Art. 12(3) GDPR, `DeletionDeadline`:
    /// after the first month, at most 90 days after receipt), with the caller's audit entry;
    /// false when the rule does not allow that date or the request is done.
    package func extendDeadline(_ id: UUID, until: Date, reason: String, audit: AuditLog.Record) throws -> Bool {
        try store.extend(id, until: until, reason: reason, audit: audit)
    }
}
