-- 0017: the OpenID Provider (issue 27). New tables only; nothing the previous release uses
-- changes. Every secret handed out (client secrets, codes, access and refresh tokens) is
-- stored as the hex SHA-256 of a 256-bit random value; only signing keys are kept whole,
-- their private halves sealed with TOKEN_ENCRYPTION_KEY like stored refresh tokens.

-- The provider's RS256 signing keys, shared by every replica. A key is pending until
-- activates_at (published, not yet signing), active until retired_at (the next key's
-- activation), then retired: still published until every token it signed has expired.
CREATE TABLE oidc_signing_keys (
    kid             text PRIMARY KEY,
    public_jwk      jsonb NOT NULL,
    private_key     bytea NOT NULL,                       -- PKCS#8 PEM, AES-256-GCM sealed
    key_id          text NOT NULL,                        -- which TOKEN_ENCRYPTION_KEY sealed it
    created_at      timestamptz NOT NULL DEFAULT now(),
    activates_at    timestamptz NOT NULL,
    retired_at      timestamptz,
    CHECK (retired_at IS NULL OR retired_at >= activates_at)
);

-- Relying parties (RFC 7591 metadata).
CREATE TABLE oidc_clients (
    client_id                            text PRIMARY KEY,
    secret_hash                          text,            -- NULL for public clients (token_endpoint_auth_method none)
    token_endpoint_auth_method           text NOT NULL
                                         CHECK (token_endpoint_auth_method IN ('client_secret_basic', 'client_secret_post', 'none')),
    redirect_uris                        text[] NOT NULL,
    grant_types                          text[] NOT NULL,
    response_types                       text[] NOT NULL,
    client_name                          text,
    scope                                text NOT NULL,
    backchannel_logout_uri               text,
    backchannel_logout_session_required  boolean NOT NULL DEFAULT false,
    created_by                           text NOT NULL,
    created_at                           timestamptz NOT NULL DEFAULT now(),
    CHECK ((secret_hash IS NULL) = (token_endpoint_auth_method = 'none'))
);

-- One sign-in of a user at one relying party: what its code, tokens and logout share.
-- Ended grants are kept (ended_at) so that a replayed code or refresh token is recognised.
CREATE TABLE oidc_grants (
    id          uuid PRIMARY KEY,
    client_id   text NOT NULL REFERENCES oidc_clients (client_id) ON DELETE CASCADE,
    user_id     uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    app_id      text NOT NULL,                            -- the app group (primary App ID) of OIDC_APPLE_CLIENT_ID
    sid         text NOT NULL,
    scope       text NOT NULL,
    auth_time   timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    ended_at    timestamptz,
    end_reason  text
);
CREATE INDEX oidc_grants_user_id ON oidc_grants (user_id) WHERE ended_at IS NULL;
CREATE INDEX oidc_grants_client_id ON oidc_grants (client_id);

-- One-time authorization codes (at most 60 s), bound to the client, redirect_uri and PKCE challenge.
CREATE TABLE oidc_codes (
    code_hash       text PRIMARY KEY,
    grant_id        uuid NOT NULL REFERENCES oidc_grants (id) ON DELETE CASCADE,
    redirect_uri    text NOT NULL,
    code_challenge  text,                                 -- S256 only
    nonce           text,
    expires_at      timestamptz NOT NULL,
    used_at         timestamptz
);
CREATE INDEX oidc_codes_grant_id ON oidc_codes (grant_id);

-- Access and refresh tokens. A refresh token is rotated on use (used_at set); presenting a
-- used one ends its grant.
CREATE TABLE oidc_tokens (
    token_hash  text PRIMARY KEY,
    grant_id    uuid NOT NULL REFERENCES oidc_grants (id) ON DELETE CASCADE,
    kind        text NOT NULL CHECK (kind IN ('access', 'refresh')),
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz
);
CREATE INDEX oidc_tokens_grant_id ON oidc_tokens (grant_id);

-- Back-Channel Logout 1.0 deliveries: one row per relying party (per session when it asked
-- for sid) whose grant a consent-revoked, a deletion request or a purge ended
-- (sql/functions/broker_oidc_end_grants.sql writes them in the event's transaction). The
-- logout token is signed when sent; retried with the webhook settings, `failed` for good
-- after BROKER_WEBHOOK_MAX_AGE_SECONDS, re-driven with POST /v1/oidc-logout-deliveries/{id}/retry.
CREATE TABLE oidc_logout_deliveries (
    id               bigserial PRIMARY KEY,
    client_id        text NOT NULL REFERENCES oidc_clients (client_id) ON DELETE CASCADE,
    url              text NOT NULL,
    sub              uuid NOT NULL,                       -- the user_id; no foreign key: a purge does not wait for the RP
    sid              text,
    reason           text NOT NULL,                       -- the outbox event that ended the grant
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_status      integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz
);
CREATE INDEX oidc_logout_deliveries_due ON oidc_logout_deliveries (next_attempt_at) WHERE state = 'pending';
