-- 0023: sessions at the OpenID Provider, RP-Initiated Logout, and logout data kept as long as
-- a relying party's session could live (issue 36). Expand only: a new table, nullable or
-- defaulted columns on the provider's own tables (the previous release has no provider).

-- A person signed in at the provider in one browser (OIDC_SESSION_SECONDS; the `__Host-abk_oidc`
-- cookie holds a 256-bit secret, stored as its hex SHA-256). One row per browser: a new sign-in
-- in the same browser rotates the secret and, for the same person, keeps the sid. At most
-- ProviderPolicy.maximumSessionsPerUser live rows per user (the oldest is ended). auth_time is
-- when Apple last authenticated the person (the identity token's auth_time, else its iat).
-- Ended by RP-Initiated Logout, by the Apple events and deletions that end grants
-- (broker_oidc_end_grants), and by the user's purge (cascade); pruned once expired or ended.
CREATE TABLE oidc_sessions (
    id            uuid PRIMARY KEY,
    browser_hash  text NOT NULL UNIQUE,
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    app_id        text NOT NULL,                          -- the app group (primary App ID) of OIDC_APPLE_CLIENT_ID
    sid           text NOT NULL UNIQUE,                   -- the `sid` claim of ID tokens and logout tokens
    auth_time     timestamptz NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    ended_at      timestamptz,
    end_reason    text
);
CREATE INDEX oidc_sessions_user_id ON oidc_sessions (user_id, created_at) WHERE ended_at IS NULL;
CREATE INDEX oidc_sessions_expires_at ON oidc_sessions (expires_at);

-- The session a grant was given in (NULL with sessions off, or once the session row is pruned:
-- the grant keeps its sid). logout_until: until when the relying party's session may still
-- live, so the grant (what a Back-Channel Logout needs: client, user, sid) is kept that long
-- even without codes or tokens: the provider session's expiry, or a refresh token's.
ALTER TABLE oidc_grants ADD COLUMN session_id uuid REFERENCES oidc_sessions (id) ON DELETE SET NULL;
ALTER TABLE oidc_grants ADD COLUMN logout_until timestamptz;
CREATE INDEX oidc_grants_session_id ON oidc_grants (session_id) WHERE session_id IS NOT NULL;
CREATE INDEX oidc_grants_sid ON oidc_grants (sid);

-- RP-Initiated Logout 1.0 §3.1: where a relying party may be sent after logout, matched exactly.
ALTER TABLE oidc_clients ADD COLUMN post_logout_redirect_uris text[] NOT NULL DEFAULT '{}';
