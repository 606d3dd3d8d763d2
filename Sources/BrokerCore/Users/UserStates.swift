import AppleID
import PostgresClient

// The states a user and their app groups are in. Raw values are the SQL values (the CHECK
// constraints of sql/) and the JSON names of the API (docs/openapi.json): decoding an
// unknown value fails instead of passing as a string.

/// Where a user is (`users.status`): `deleting` from the deletion request to the purge.
public enum UserStatus: String, Sendable, CaseIterable, PostgresDecodable, PostgresEncodable {
    case active, deleting
}

/// An app group's consent (`apple_grants.consent`): `revoked` by Apple's `consent-revoked`
/// or the sweep's dead grant, `active` again at the group's next login.
public enum Consent: String, Sendable, CaseIterable, PostgresDecodable, PostgresEncodable {
    case active, revoked
}

/// Whether Apple forwards mail to an app group's relay address (`apple_grants.email_forwarding`),
/// as its `email-disabled` and `email-enabled` notifications say.
public enum EmailForwarding: String, Sendable, CaseIterable, PostgresDecodable, PostgresEncodable {
    case enabled, disabled
}

/// The server-side twin of Apple's `getCredentialState` (`GET /v1/users/{id}/credential-state`).
package enum CredentialState: String, Sendable, CaseIterable {
    case authorized, revoked, transferred, deleted
    /// Authorized at Apple, but the stored refresh token is dead (Apple's `invalid_grant`):
    /// a fresh sign-in is needed to store a new one.
    case tokenInvalid = "token_invalid"
    case notFound = "not_found"
}

/// Apple's `real_user_status` as stored (`apple_identities.real_user_status`).
extension RealUserStatus: PostgresDecodable, PostgresEncodable {}
