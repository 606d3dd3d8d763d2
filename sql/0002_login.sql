-- 0002: login support: code-exchange dedup. The outbox emitter and the login upsert are
-- functions: sql/functions/ (broker_emit_event, broker_identity_unchanged, broker_login,
-- broker_revoke_consent).

-- Authorization codes being or having been exchanged, by SHA-256: a code is exchanged at
-- most once even when a client retries the same login concurrently.
CREATE TABLE authorization_codes (
    code_hash   text PRIMARY KEY,
    client_id   text NOT NULL,
    state       text NOT NULL CHECK (state IN ('exchanging', 'exchanged', 'failed')),
    error_code  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX authorization_codes_created ON authorization_codes (created_at);
