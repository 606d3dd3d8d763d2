-- 0021: deletions decided per app group and their TN3194 follow-ups closed for good, handed-over
-- codes of an open deletion, team transfers dated by the transfer, and dormant users (issue 35,
-- items 5, 9, 10, 12, 13). Expand only: new tables, nullable columns and indexes the previous
-- release neither reads nor writes.

-- What a deletion came to at Apple for each app group the user had used (DeletionJob, when
-- its revoke phase ends; protocol reference §12.3): 'revoked' (a token Apple had just
-- refreshed, so alive, was revoked: only then is a 200 from /auth/revoke proof), 'already_invalid'
-- (Apple had told the broker the user stopped using the group: nothing to end),
-- 'manual_required' (no live token: the user must stop using Sign in with Apple for the group
-- in Settings, TN3194), 'transferred' (the group moved to another team, `transfer complete`:
-- not this team's authorization to end). The request's apple_revocation sums them up.
-- A manual_required group is a follow-up. sub_hash (the keyed hash of the user's sub in this
-- team, as the tombstone keeps it) and authorized_at (the group's last sign-in the broker knew
-- of) let a later consent-revoked of the group, newer than that sign-in, or an account-delete
-- of the user close it (sql/functions/broker_close_follow_ups.sql) when it arrives, once:
-- the closure is a column of its own, so pruning the notification inbox never reopens it.
-- 'retention': a dormant user's deletion (Housekeeping), with nobody to ask.
CREATE TABLE deletion_app_groups (
    deletion_id         uuid NOT NULL REFERENCES deletion_requests (id) ON DELETE CASCADE,
    app_id              text NOT NULL,
    client_ids          text[] NOT NULL,
    revocation          text NOT NULL
        CHECK (revocation IN ('revoked', 'already_invalid', 'manual_required', 'transferred')),
    decided_at          timestamptz NOT NULL DEFAULT now(),
    sub_hash            text,
    authorized_at       timestamptz,
    follow_up_closed_at timestamptz,
    follow_up_closed_by text CHECK (follow_up_closed_by IN ('consent-revoked', 'account-delete', 'retention')),
    PRIMARY KEY (deletion_id, app_id)
);
CREATE INDEX deletion_app_groups_open ON deletion_app_groups (sub_hash)
    WHERE revocation = 'manual_required' AND follow_up_closed_at IS NULL;

-- A handed-over code the API request is exchanging, until this time (HandedOverCode): the job
-- does not end the revoke phase meanwhile, so what the code yields is revoked before the
-- purge, also when the code reaches a request the job already works on.
ALTER TABLE deletion_requests ADD COLUMN code_exchange_until timestamptz;

-- Team transfer (TN3159), recipient: when the transfer completed as far as the broker knows
-- (the import's first answer from Apple, or `--transferred-at`). Staged lines live until a
-- day after the 60-day window that starts then, not after staging, which may come weeks
-- before the transfer. NULL: not known yet (Housekeeping says how long such a line lives).
ALTER TABLE transfer_staged ADD COLUMN transferred_at timestamptz;

-- Team transfer, sender: the client ids that moved to another team (`transfer complete`).
-- Their tokens were issued under this team, whose credentials can neither refresh nor revoke
-- them now: the sweep and deletions leave them alone.
CREATE TABLE transferred_apps (
    team_id        text NOT NULL,
    client_id      text NOT NULL,
    recipient_team text NOT NULL,
    transferred_at timestamptz NOT NULL,
    recorded_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, client_id)
);

-- Dormant users (Housekeeping, BROKER_DORMANT_USER_RETENTION_SECONDS): where the evidence
-- that a user's tokens are dead is found without reading every user.
CREATE INDEX apple_tokens_dead ON apple_tokens (revoked_at) WHERE revoked_reason IS NOT NULL;
CREATE INDEX apple_grants_revoked ON apple_grants (consent_at) WHERE consent = 'revoked';
