-- 0025: least privilege between insiders, every administrative act audited (issue 38).
-- Expand only: nullable columns and a table the previous release neither reads nor writes.

-- The audit model: who acted (actor), on what (target, e.g. `api_key:<id>`,
-- `webhook_subscription:<uuid>`, `console_session`), with what result (outcome: succeeded,
-- refused, failed). Rows written before this migration have neither; since, every row has an
-- outcome, and a target where the act has one (the trigger of sql/functions/broker_audit_defaults.sql
-- fills them for the released functions' and the previous release's rows). Still identifiers
-- and hashes only: no personal data, no secrets.
ALTER TABLE audit_log ADD COLUMN target text, ADD COLUMN outcome text;
-- NOT VALID: checked for new rows without scanning (and locking) the whole log.
ALTER TABLE audit_log ADD CONSTRAINT audit_log_outcome CHECK (outcome IN ('succeeded', 'refused', 'failed')) NOT VALID;

-- Every client id an Apple identity has signed in with, kept while the identity lives (a
-- sign-in with an identity token only leaves no token, and the identity's client_id is only
-- the last one): a key limited to app A must count a user of app B as shared even then.
-- Written by the apple_identities_app_seen trigger (sql/functions/broker_identity_app_seen.sql),
-- so the previous release's sign-ins are recorded too.
CREATE TABLE apple_identity_apps (
    identity_id    uuid NOT NULL REFERENCES apple_identities (id) ON DELETE CASCADE,
    client_id      text NOT NULL,
    first_seen_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (identity_id, client_id)
);
INSERT INTO apple_identity_apps (identity_id, client_id)
SELECT id, client_id FROM apple_identities
UNION SELECT identity_id, client_id FROM apple_tokens
ON CONFLICT DO NOTHING;

-- The app groups (primary App IDs) of the key that made a subscription, beside its client
-- ids: a grant event names its group's primary, which is the key's own grant when one of its
-- client ids is in that group. NULL (a subscription of an unlimited key, or made by the
-- previous release): the client ids alone.
ALTER TABLE webhook_subscriptions ADD COLUMN app_ids text[];

-- The operator's mapped IdP groups at sign-in: the session's roles are worked out from them
-- and the role map on every request (CONSOLE_OIDC_ROLE_MAP changed: the roles change at
-- once). NULL: a sign-in link's session (its role is the link's) or one the previous release
-- opened (its stored roles).
ALTER TABLE console_sessions ADD COLUMN groups text[];

-- The console's overview charts read the last days of deletions and of the deletion job's
-- steps, tables kept for good (one row per deletion, a few per step): by time, not by scan.
CREATE INDEX deletion_requests_created ON deletion_requests (created_at);
CREATE INDEX deletion_steps_at ON deletion_steps (at);
