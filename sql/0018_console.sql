-- 0018: the operator console (issue 30, docs/console.md). Expand only: new tables and
-- nullable columns the previous release never reads.

-- A signed-in operator. The cookie holds a random id; only its SHA-256 is stored, so a
-- copy of this table signs nobody in. Ended sessions are kept until they expire (sign-out
-- ends them here, on the server), then housekeeping may drop them.
CREATE TABLE console_sessions (
    id_hash       bytea PRIMARY KEY,
    operator      text NOT NULL,                 -- the IdP's `sub`, or the name a sign-in link was made for
    operator_name text NOT NULL,
    roles         text[] NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    auth_time     timestamptz NOT NULL,          -- when the operator last proved who they are (step-up)
    expires_at    timestamptz NOT NULL,
    ended_at      timestamptz
);
CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);

-- Single-use sign-in links (`appleid-broker console link`), stored hashed.
CREATE TABLE console_links (
    token_hash  bytea PRIMARY KEY,
    operator    text NOT NULL,
    role        text NOT NULL CHECK (role IN ('viewer', 'operator', 'compliance', 'admin')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz
);

-- An OpenID Connect sign-in under way, keyed by the hash of its `state`: the PKCE verifier
-- and the nonce stay on the server, so the callback needs no cookie (SameSite=Strict).
CREATE TABLE console_oidc_transactions (
    state_hash   bytea PRIMARY KEY,
    nonce        text NOT NULL,
    verifier     text NOT NULL,
    return_to    text NOT NULL,
    step_up_of   bytea,                          -- the session a step-up re-authenticates
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);

-- What the compliance team records with a deletion it opens (Art. 12(3) GDPR: the month runs
-- from receipt). Written by the console only; the API leaves them NULL.
ALTER TABLE deletion_requests
    ADD COLUMN received_at      timestamptz,
    ADD COLUMN ticket           text CHECK (length(ticket) <= 200),
    ADD COLUMN extended_until   timestamptz,
    ADD COLUMN extension_reason text CHECK (length(extension_reason) <= 500);
