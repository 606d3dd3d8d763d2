-- 0001: the whole schema of DESIGN.md §3.
--
-- Personal data lives only in users, apple_identities and apple_tokens, which hang off
-- users(id) ON DELETE CASCADE, so deleting the user row purges the person. Outbox events
-- are thin on purpose (the user id and non-personal facts; backends read details through
-- the API), and what stays after a purge (deletion_requests, deletion_steps, tombstones,
-- audit_log, apple_notifications) holds identifiers and hashes only: no name, e-mail or token.

CREATE TABLE users (
    id          uuid PRIMARY KEY,
    status      text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'deleting')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One Apple account (team-scoped `sub`) linked to a broker user.
CREATE TABLE apple_identities (
    id                   uuid PRIMARY KEY,
    user_id              uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    team_id              text NOT NULL,
    sub                  text NOT NULL,
    client_id            text NOT NULL,                   -- `aud` of the last verified token
    email                text,
    email_verified       boolean NOT NULL DEFAULT false,
    is_private_email     boolean NOT NULL DEFAULT false,
    email_forwarding     text NOT NULL DEFAULT 'enabled' CHECK (email_forwarding IN ('enabled', 'disabled')),
    email_forwarding_at  timestamptz,                     -- event_time of the change applied last
    real_user_status     text CHECK (real_user_status IN ('unsupported', 'unknown', 'likely_real')),
    consent              text NOT NULL DEFAULT 'active' CHECK (consent IN ('active', 'revoked')),
    consent_at           timestamptz,                     -- event_time of the change applied last
    given_name           text,                            -- from the first authorization only
    family_name          text,
    transfer_sub         text,                            -- transfer identifier this identity arrived with
    transferred_at       timestamptz,                     -- moved to another team (credential state `transferred`)
    created_at           timestamptz NOT NULL DEFAULT now(),
    last_login_at        timestamptz,
    last_verified_at     timestamptz,
    CONSTRAINT apple_identities_team_sub_key UNIQUE (team_id, sub)
) WITH (fillfactor = 85);  -- room for HOT updates of last_login_at on repeat logins
CREATE INDEX apple_identities_user_id ON apple_identities (user_id);
CREATE INDEX apple_identities_transfer_sub ON apple_identities (transfer_sub) WHERE transfer_sub IS NOT NULL;

-- Refresh tokens, encrypted (AES-256-GCM, associated data binds identity and client id),
-- with the client id they were issued to: revocation must use that same client id.
CREATE TABLE apple_tokens (
    id                  uuid PRIMARY KEY,
    identity_id         uuid NOT NULL REFERENCES apple_identities (id) ON DELETE CASCADE,
    user_id             uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    client_id           text NOT NULL,
    refresh_token       bytea NOT NULL,
    key_id              text NOT NULL,
    obtained_at         timestamptz NOT NULL DEFAULT now(),
    last_validated_at   timestamptz,
    next_validation_at  timestamptz NOT NULL DEFAULT now() + interval '1 day',
    revoked_at          timestamptz,
    CONSTRAINT apple_tokens_identity_client_key UNIQUE (identity_id, client_id)
);
CREATE INDEX apple_tokens_user_id ON apple_tokens (user_id);
CREATE INDEX apple_tokens_due ON apple_tokens (next_validation_at) WHERE revoked_at IS NULL;

-- Inbox of Apple's server-to-server notifications, deduplicated on `jti`.
CREATE TABLE apple_notifications (
    jti           text PRIMARY KEY,
    event_type    text NOT NULL,
    sub_hash      text,                                   -- SHA-256 of `sub`, never the sub itself
    event_time    timestamptz,
    outcome       text NOT NULL,
    received_at   timestamptz NOT NULL DEFAULT now()
);

-- Deletion requests: the deletion job's queue and its record.
CREATE TABLE deletion_requests (
    id               uuid PRIMARY KEY,
    user_id          uuid NOT NULL,                       -- no foreign key: the record outlives the user
    source           text NOT NULL CHECK (source IN ('api', 'cli', 'apple')),
    reason           text NOT NULL,
    requested_by     text NOT NULL,
    state            text NOT NULL DEFAULT 'requested'
                     CHECK (state IN ('requested', 'revoking', 'purging', 'done', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz
);
-- At most one open request per user: a second request returns the first.
CREATE UNIQUE INDEX deletion_requests_one_open ON deletion_requests (user_id) WHERE state NOT IN ('done', 'failed');
CREATE INDEX deletion_requests_due ON deletion_requests (next_attempt_at) WHERE state IN ('requested', 'revoking', 'purging');
CREATE INDEX deletion_requests_state ON deletion_requests (state, created_at);

-- The result of each step of a deletion (each Apple revoke call included), append-only.
CREATE TABLE deletion_steps (
    id           bigserial PRIMARY KEY,
    deletion_id  uuid NOT NULL REFERENCES deletion_requests (id) ON DELETE CASCADE,
    step         text NOT NULL,
    client_id    text,
    outcome      text NOT NULL,
    detail       text,
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX deletion_steps_deletion ON deletion_steps (deletion_id, id);

-- Transactional outbox. `txid` is the writing transaction's id: feeds read only rows
-- whose transaction is older than every transaction still in flight, so a row that
-- commits late is never skipped (DESIGN.md §3, outbox pitfall). Payloads hold the user id
-- and non-personal facts only.
CREATE TABLE outbox_events (
    id          bigserial PRIMARY KEY,
    type        text NOT NULL,
    user_id     uuid,
    payload     jsonb NOT NULL,
    txid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_events_feed ON outbox_events (txid, id);

CREATE TABLE webhook_subscriptions (
    id           uuid PRIMARY KEY,
    url          text NOT NULL,
    topics       jsonb NOT NULL,
    secret       bytea NOT NULL,                          -- signing secret, encrypted like refresh tokens
    key_id       text NOT NULL,
    status       text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'paused')),
    description  text,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- One delivery per (event, subscription), created in the transaction that wrote the event.
CREATE TABLE webhook_deliveries (
    id               bigserial PRIMARY KEY,
    event_id         bigint NOT NULL REFERENCES outbox_events (id) ON DELETE CASCADE,
    subscription_id  uuid NOT NULL REFERENCES webhook_subscriptions (id) ON DELETE CASCADE,
    ordering_key     uuid,                                -- the user: one user's events go in order
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_status      integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    CONSTRAINT webhook_deliveries_event_subscription_key UNIQUE (event_id, subscription_id)
);
-- The dispatcher's claim walks this index in (next_attempt_at, id) order and stops at the
-- first claimable row, however long the backlog. Deliveries of a paused subscription are
-- parked at next_attempt_at = 'infinity' so that walk never wades through them.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at, id) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_ordering ON webhook_deliveries (subscription_id, ordering_key, id) WHERE state = 'pending';

-- API keys for app backends, compliance and operators: only a hash is stored.
CREATE TABLE api_keys (
    id            text PRIMARY KEY,                       -- public id, embedded in the key
    name          text NOT NULL,
    key_hash      bytea NOT NULL,                         -- SHA-256 of the whole key
    scopes        text NOT NULL,                          -- comma-separated, sorted
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);

-- Append-only record of what happened, without personal data (hashes and ids only).
CREATE TABLE audit_log (
    id           bigserial PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    actor        text NOT NULL,
    action       text NOT NULL,
    subject      text,
    deletion_id  uuid,
    detail       jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_deletion ON audit_log (deletion_id) WHERE deletion_id IS NOT NULL;
CREATE INDEX audit_log_subject ON audit_log (subject) WHERE subject IS NOT NULL;

-- Append-only: the trigger lives with its function, sql/functions/audit_log_append_only.sql.

-- What remains of a purged Apple identity: enough to say "this sub was deleted", nothing more.
CREATE TABLE tombstones (
    deletion_id   uuid NOT NULL,
    team_id       text NOT NULL,
    sub_hash      text NOT NULL,
    user_id       uuid NOT NULL,
    reason        text NOT NULL,
    requested_by  text NOT NULL,
    deleted_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (deletion_id, sub_hash)
);
CREATE INDEX tombstones_sub ON tombstones (team_id, sub_hash);
CREATE INDEX tombstones_user ON tombstones (user_id);
