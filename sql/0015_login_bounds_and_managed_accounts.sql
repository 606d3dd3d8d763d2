-- 0015: the rest of issue 28 (protocol reference §11). Expand only: the previous release
-- writes and reads these tables as before and never looks at the new columns and table.

-- Code exchanges per user are bounded (a login key plus one valid identity token must not buy
-- unlimited calls to Apple's token endpoint): each ledger row names the user it was for by
-- the keyed hash of team and sub (as tombstones do; the row lives an hour, like the ledger),
-- and CodeExchangeStore counts them per client id before a code goes to Apple. NULL on rows
-- the previous release writes.
ALTER TABLE authorization_codes ADD COLUMN subject_hash text;
CREATE INDEX authorization_codes_subject ON authorization_codes (subject_hash, created_at) WHERE subject_hash IS NOT NULL;

-- Managed Apple Accounts (Work & School) carry `org_id`, the organisation that manages the
-- account (protocol reference §11.7); kept on the identity and shown with the user.
ALTER TABLE apple_identities ADD COLUMN org_id text;

-- Team transfer, recipient side: `transfer import` first writes down every line of the file
-- (transfer_sub → the sender's user id), then asks Apple for each. A login carrying one of
-- these transfer_subs before the import reached it joins that user id instead of creating a
-- new user; the import then finds the identity there. Rows go a day after Apple's 60-day
-- window (Housekeeping).
CREATE TABLE transfer_staged (
    team_id      text NOT NULL,
    transfer_sub text NOT NULL,
    user_id      uuid NOT NULL,
    staged_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, transfer_sub)
);
CREATE INDEX transfer_staged_user ON transfer_staged (user_id);
