-- 0024: the OpenID Provider's client authentication, introspection and home-lab redirects
-- (issue 36). Expand only: nullable or defaulted columns and new tables that the previous
-- release neither reads nor writes.
--
-- private_key_jwt clients (RFC 7523, OpenID Connect Core §9) keep their public keys here.
-- Their row says token_endpoint_auth_method 'client_secret_basic' with the hash of a random
-- secret that is never shown: the previous release, which knows no private_key_jwt, reads
-- such a client as one whose secret nobody has and refuses it, where a new method name would
-- have fallen into its public-client branch (no authentication at all). This release reads
-- jwks or jwks_uri first.
ALTER TABLE oidc_clients
    ADD COLUMN jwks text,                                 -- a JWK Set (JSON), public keys only
    ADD COLUMN jwks_uri text,                             -- fetched under the outbound address rules
    ADD COLUMN token_endpoint_auth_signing_alg text,      -- RS256 or ES256; NULL: either
    -- The admin's explicit opt-in to plain-http redirect URIs on private-network hosts.
    ADD COLUMN private_network_http_redirects boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT oidc_clients_one_key_source CHECK (jwks IS NULL OR jwks_uri IS NULL);

-- jti values of client assertions already accepted: each is good once (RFC 7523 §3 item 7),
-- kept until the assertion's exp (at most an hour ahead), then pruned.
CREATE TABLE oidc_client_assertions (
    client_id   text NOT NULL REFERENCES oidc_clients (client_id) ON DELETE CASCADE,
    jti_hash    text NOT NULL,                            -- hex SHA-256 of the jti
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (client_id, jti_hash)
);
CREATE INDEX oidc_client_assertions_expires_at ON oidc_client_assertions (expires_at);

-- Resource servers allowed to introspect access tokens (RFC 7662): each authenticates with
-- its own secret (stored as its SHA-256) and sees only tokens issued to the relying parties
-- it serves (client_ids, its audience); any other token is {"active": false}.
CREATE TABLE oidc_resource_servers (
    resource_server_id  text PRIMARY KEY,
    secret_hash         text NOT NULL,
    name                text,
    client_ids          text[] NOT NULL,
    created_by          text NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now()
);
