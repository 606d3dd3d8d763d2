import AppleID
import Foundation
import Observability
import PostgresClient
import StrictJSON

/// Read access to users for app backends: `GET /v1/users/{id}` and its credential state.
package struct UserDirectory: Sendable {
    let pool: PostgresPool
    /// Which client ids share an authorization (consent is kept per group).
    let groups: AppGroups

    package init(pool: PostgresPool, groups: AppGroups) {
        self.pool = pool
        self.groups = groups
    }

    /// Consent and mail forwarding for one app group (named by its primary App ID).
    struct AppGrant: Sendable, Equatable {
        var clientID: String
        var consent: Consent
        var emailForwarding: EmailForwarding
        var refreshTokenStored: Bool

        var json: JSONValue {
            .object([
                "client_id": .string(clientID), "consent": .string(consent.rawValue),
                "email_forwarding": .string(emailForwarding.rawValue),
                "refresh_token_stored": .bool(refreshTokenStored),
            ])
        }
    }

    struct Identity: Sendable {
        var appleSub: String
        var teamID: String
        var clientID: String
        var email: String?
        /// Apple's unsigned first-authorization e-mail, when the verified token had another or none.
        var unverifiedEmail: String?
        var emailVerified: Bool
        var isPrivateEmail: Bool
        var emailForwarding: EmailForwarding
        var realUserStatus: RealUserStatus?
        var consent: Consent
        var givenName: String?
        var familyName: String?
        var transferred: Bool
        /// A Managed Apple Account's organisation (`org_id`); nil for personal accounts.
        var orgID: String?
        var createdAt: Date
        var lastLoginAt: Date?
        /// Per app group: the group of `clientID`, every group with a stored refresh token, and
        /// every group Apple told us about. `consent` and `emailForwarding` above are those
        /// of `clientID`'s group.
        var apps: [AppGrant]

        /// Members that are unknown (nil) are left out.
        var json: JSONValue {
            var members: [String: JSONValue] = [
                "apple_sub": .string(appleSub), "team_id": .string(teamID), "client_id": .string(clientID),
                "email_verified": .bool(emailVerified), "is_private_email": .bool(isPrivateEmail),
                "email_forwarding": .string(emailForwarding.rawValue), "consent": .string(consent.rawValue),
                "transferred": .bool(transferred),
                "created_at": .string(RFC3339.string(from: createdAt)), "apps": .array(apps.map(\.json)),
            ]
            let optional: [(String, String?)] = [
                ("email", email), ("unverified_email", unverifiedEmail), ("real_user_status", realUserStatus?.rawValue),
                ("given_name", givenName), ("family_name", familyName), ("org_id", orgID),
                ("last_login_at", lastLoginAt.map(RFC3339.string(from:))),
            ]
            for case (let name, let value?) in optional { members[name] = .string(value) }
            return .object(members)
        }
    }

    package struct User: Sendable {
        var userID: String
        var status: UserStatus
        var createdAt: Date
        var identities: [Identity]

        package var json: JSONValue {
            .object([
                "user_id": .string(userID), "status": .string(status.rawValue),
                "created_at": .string(RFC3339.string(from: createdAt)),
                "identities": .array(identities.map(\.json)),
            ])
        }
    }

    /// The user with every identity (never tokens). For a key limited to some apps, only the
    /// grants of their app groups: never another app's grant of a shared user.
    package func user(_ id: UUID, for key: APIKey? = nil) throws -> User? {
        guard let row = try pool.query("SELECT status, created_at FROM users WHERE id = \(id)").first else { return nil }
        let grants = try appGrants(ofUser: id)
        let identities = try pool.query(
            """
            SELECT id, sub, team_id, client_id, email, email_verified, is_private_email, real_user_status,
                   given_name, family_name, transferred_at IS NOT NULL AS transferred, created_at, last_login_at, unverified_email, org_id
            FROM apple_identities WHERE user_id = \(id) ORDER BY created_at
            """
        ).map { row in
            let clientID = try row.decode(String.self, "client_id")
            // The group of `clientID` comes first.
            let primary = groups.group(of: clientID).primary
            var apps = (grants[try row.decode(UUID.self, "id")] ?? KnownGrants()).apps(including: primary)
            if let reach = key?.grantReach { apps = apps.filter { reach.contains($0.clientID) } }
            // The identity's consent is its last app's grant, or else the first the key may see.
            let current =
                apps.first ?? AppGrant(clientID: primary, consent: .active, emailForwarding: .enabled, refreshTokenStored: false)
            return Identity(
                appleSub: try row.decode(String.self, "sub"), teamID: try row.decode(String.self, "team_id"),
                clientID: clientID, email: try row.decode(String?.self, "email"),
                unverifiedEmail: try row.decode(String?.self, "unverified_email"),
                emailVerified: try row.decode(Bool.self, "email_verified"),
                isPrivateEmail: try row.decode(Bool.self, "is_private_email"),
                emailForwarding: current.emailForwarding,
                realUserStatus: try row.decode(RealUserStatus?.self, "real_user_status"),
                consent: current.consent, givenName: try row.decode(String?.self, "given_name"),
                familyName: try row.decode(String?.self, "family_name"), transferred: try row.decode(Bool.self, "transferred"),
                orgID: try row.decode(String?.self, "org_id"),
                createdAt: try row.decode(Date.self, "created_at"), lastLoginAt: try row.decode(Date?.self, "last_login_at"),
                apps: apps)
        }
        return User(
            userID: id.lowercasedString, status: try row.decode(UserStatus.self, "status"),
            createdAt: try row.decode(Date.self, "created_at"),
            identities: identities)
    }

    /// What is known per identity and app group: grant rows (Apple's notifications and the
    /// sweep's verdicts) and stored refresh tokens.
    private struct KnownGrants {
        var states: [String: (consent: Consent, emailForwarding: EmailForwarding)] = [:]
        var withToken: Set<String> = []

        func apps(including current: String) -> [AppGrant] {
            let names = Set(states.keys).union(withToken).union([current])
            return names.sorted { ($0 == current ? 0 : 1, $0) < ($1 == current ? 0 : 1, $1) }.map { name in
                AppGrant(
                    clientID: name, consent: states[name]?.consent ?? .active,
                    emailForwarding: states[name]?.emailForwarding ?? .enabled, refreshTokenStored: withToken.contains(name))
            }
        }
    }

    private func appGrants(ofUser id: UUID) throws -> [UUID: KnownGrants] {
        var known: [UUID: KnownGrants] = [:]
        for row in try pool.query("SELECT identity_id, app_id, consent, email_forwarding FROM apple_grants WHERE user_id = \(id)")
        {
            known[try row.decode(UUID.self, "identity_id"), default: KnownGrants()].states[
                try row.decode(String.self, "app_id")] =
                (try row.decode(Consent.self, "consent"), try row.decode(EmailForwarding.self, "email_forwarding"))
        }
        for row in try pool.query(
            "SELECT identity_id, client_id FROM apple_tokens WHERE user_id = \(id) AND revoked_at IS NULL")
        {
            known[try row.decode(UUID.self, "identity_id"), default: KnownGrants()].withToken.insert(
                groups.group(of: try row.decode(String.self, "client_id")).primary)
        }
        return known
    }

    /// Whether `key` may see this user (`AppReach`).
    package func isVisible(_ id: UUID, to key: APIKey) throws -> Bool { try AppReach.user(id, visibleTo: key, pool: pool) }

    /// The deletion that purged this user, if one did.
    package func deletion(ofPurgedUser id: UUID) throws -> UUID? {
        try pool.query("SELECT deletion_id FROM tombstones WHERE user_id = \(id) LIMIT 1").first?.decode(UUID.self, "deletion_id")
    }

    /// Whether the identity's refresh tokens (of these client ids, or all) died with Apple's
    /// `invalid_grant` and no live one is stored: the consent stands, but the broker can
    /// neither check nor revoke it until the user signs in again (protocol reference §11.3).
    private func tokenInvalid(_ identity: UUID, clientIDs: [String]?) throws -> Bool {
        let scope = clientIDs.map { PostgresTextArray($0) }
        let row = try pool.query(
            """
            SELECT bool_or(revoked_at IS NULL) AS live, bool_or(revoked_at IS NOT NULL AND revoked_reason = 'token_invalid') AS dead
            FROM apple_tokens WHERE identity_id = \(identity) AND (\(scope)::text[] IS NULL OR client_id = ANY (\(scope)::text[]))
            """
        ).single()
        return try !(row.decode(Bool?.self, "live") ?? false) && (row.decode(Bool?.self, "dead") ?? false)
    }

    /// The server-side twin of `getCredentialState`: `authorized`, `revoked`, `token_invalid`
    /// (authorized at Apple, but the stored refresh token is dead: a fresh sign-in is needed),
    /// `transferred`, `deleted` or `not_found`. The identity used last decides. With `clientID`, the answer
    /// is for that client id's app group (`revoked` once Apple revoked that group's consent);
    /// without, `authorized` while any group the identity is known in is authorized.
    ///
    /// For a key limited to some apps, `clientID` must be one of them (403 `client_not_allowed`)
    /// and the answer without it looks only at their app groups.
    package func credentialState(_ id: UUID, clientID: String? = nil, for key: APIKey? = nil) throws -> CredentialState {
        if let clientID, let key, !key.reaches(clientID) {
            throw BrokerError(.clientNotAllowed, "client_id is not one of this API key's client ids")
        }
        if let row = try pool.query(
            """
            SELECT i.id, i.client_id, i.transferred_at IS NOT NULL AS transferred, u.status FROM users u
            JOIN apple_identities i ON i.user_id = u.id WHERE u.id = \(id)
            ORDER BY i.transferred_at IS NULL DESC, i.last_login_at DESC NULLS LAST LIMIT 1
            """
        ).first {
            if try row.decode(UserStatus.self, "status") == .deleting { return .deleted }
            if try row.decode(Bool.self, "transferred") { return .transferred }
            let identity = try row.decode(UUID.self, "id")
            var apps = (try appGrants(ofUser: id)[identity] ?? KnownGrants())
                .apps(including: groups.group(of: try row.decode(String.self, "client_id")).primary)
            if let reach = key?.grantReach { apps = apps.filter { reach.contains($0.clientID) } }
            if let clientID {
                let group = groups.group(of: clientID)
                if apps.first(where: { $0.clientID == group.primary })?.consent == .revoked { return .revoked }
                return try tokenInvalid(identity, clientIDs: group.clientIDs) ? .tokenInvalid : .authorized
            }
            guard apps.contains(where: { $0.consent == .active }) else { return .revoked }
            let scope = key?.reach.map { reach in Array(Set(reach.flatMap { groups.group(of: $0).clientIDs })).sorted() }
            return try tokenInvalid(identity, clientIDs: scope) ? .tokenInvalid : .authorized
        }
        return try deletion(ofPurgedUser: id) != nil ? .deleted : .notFound
    }

    /// What a user's Apple identity says about them, read now (e-mail forwarding changes show
    /// at once): the identity signed in last (not a transferred-away one), and mail
    /// forwarding of `appID`'s group (`apple_grants`; no row: enabled).
    package struct Profile: Sendable {
        package var email: String?
        package var emailVerified: Bool
        package var isPrivateEmail: Bool
        package var emailForwarding: String
        package var givenName: String?
        package var familyName: String?
    }

    /// The profile of a user for the OpenID Provider's `email` and `profile` claims, with the
    /// mail forwarding of the app group whose primary App ID is `appID`.
    package func profile(of userID: UUID, appID: String) throws -> Profile? {
        try pool.query(
            """
            SELECT i.email, i.email_verified, i.is_private_email, coalesce(g.email_forwarding, 'enabled') AS email_forwarding,
                   i.given_name, i.family_name
            FROM apple_identities i LEFT JOIN apple_grants g ON g.identity_id = i.id AND g.app_id = \(appID)
            WHERE i.user_id = \(userID) AND i.transferred_at IS NULL
            ORDER BY i.last_login_at DESC NULLS LAST, i.created_at DESC LIMIT 1
            """
        ).first.map {
            Profile(
                email: try $0.decode(String?.self, "email"), emailVerified: try $0.decode(Bool.self, "email_verified"),
                isPrivateEmail: try $0.decode(Bool.self, "is_private_email"),
                emailForwarding: try $0.decode(String.self, "email_forwarding"),
                givenName: try $0.decode(String?.self, "given_name"), familyName: try $0.decode(String?.self, "family_name"))
        }
    }
}
