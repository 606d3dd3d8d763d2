/// Lifetimes and bounds of what the provider issues (fixed: standards and RPs expect them).
package enum ProviderPolicy {
    /// Authorization codes live at most this long (RFC 6749 §4.1.2 recommends at most 10 minutes; the issue 60 s).
    static let codeLifetimeSeconds = 60
    /// Access tokens: short-lived, stored, checked on every use (revocation is immediate).
    static let accessTokenLifetimeSeconds = 600
    /// ID tokens: a retired signing key stays published at least this long plus leeway.
    package static let idTokenLifetimeSeconds = 3600
    /// Refresh tokens (offline_access): rotated on every use.
    static let refreshTokenLifetimeSeconds = 90 * 86_400
    /// Used refresh tokens a grant keeps for reuse detection (GrantStore.forgetOldRefreshTokens).
    static let usedRefreshTokensKept = 10
    /// Distinct client ids that label the success metrics; later ones count as `other`.
    static let maximumClientLabels = 200
    /// How long a sign-in may take at Apple (the sealed state's lifetime).
    static let stateLifetimeSeconds = 600
    /// How long a retired key stays in the JWKS after it stopped signing.
    package static let retiredKeyPublicationSeconds = idTokenLifetimeSeconds + 300
    /// The scopes the provider knows.
    static let scopes: Set<String> = ["openid", "email", "profile", "offline_access"]
    /// Bounds on what an outsider sends (RP `state`, `nonce`, PKCE challenge, redirect URIs).
    static let maximumStateBytes = 512
    static let maximumNonceBytes = 256
    static let maximumRedirectURIBytes = 2048
    static let maximumRedirectURIs = 16
    /// Live sessions one person may hold at the provider (browsers); a new one ends the oldest.
    static let maximumSessionsPerUser = 20
    /// `max_age` values beyond this (ten years) are read as this.
    static let maximumMaxAgeSeconds = 10 * 365 * 86_400
    /// Without a session (OIDC_SESSION_SECONDS=0) a grant is kept this long for its Back-Channel Logout.
    static let sessionlessLogoutSeconds = 86_400
}
