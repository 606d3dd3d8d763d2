-- Web sign-in (Services ID, response_mode=form_post). State lives here, not in a cookie,
-- so Apple's cross-site POST back cannot lose it (protocol reference P6).
--
-- One row per authorization request: the state (stored as its SHA-256, it is a bearer
-- secret) is single use and short-lived. The name from Apple's unsigned `user` field is
-- written in the same statement that consumes the state, before anything else can fail:
-- Apple sends it once (P7).
CREATE TABLE web_authorizations (
    state_hash   text PRIMARY KEY,
    client_id    text NOT NULL,
    return_to    text NOT NULL,
    app_state    text,
    raw_nonce    text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    consumed_at  timestamptz,
    given_name   text,
    family_name  text,
    -- The verified sub, once the callback's identity token verified.
    apple_sub    text
);
CREATE INDEX web_authorizations_expiry ON web_authorizations (expires_at);

-- One-time result codes handed to the app's return_to; the app backend redeems one for
-- the login answer. Stored hashed, deleted when redeemed.
CREATE TABLE web_results (
    code_hash   text PRIMARY KEY,
    client_id   text NOT NULL,
    response    jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX web_results_expiry ON web_results (expires_at);
