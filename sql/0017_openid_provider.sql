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
