-- 0012: API keys limited to some apps (`api-keys create --client-ids A,B`).
--
-- A limited key holds the client ids it was given (NULL: every app, as before); the broker
-- widens them to their app groups (APPLE_APP_GROUPS) when it reads the key. It logs in
-- only tokens whose `aud` is one of them, and sees only users, deletions, events and
-- webhook subscriptions of those apps.
ALTER TABLE api_keys ADD COLUMN client_ids text[];

-- Subscriptions made by a limited key belong to it and receive only its apps' events.
ALTER TABLE webhook_subscriptions ADD COLUMN api_key_id text, ADD COLUMN client_ids text[];

-- The apps a user was in when their deletion was requested: the deletion record and the
-- user's events stay visible to those apps' keys after the purge has removed the user.
ALTER TABLE deletion_requests ADD COLUMN client_ids text[];

-- New requests get them from a trigger (sql/functions/broker_deletion_request_apps.sql);
-- existing ones here. A backfill is history: it computes what this release meant (the
-- identities', tokens' and grants' client ids) and calls no function, whose meaning may move
-- on and which the runner applies only after the migrations.
UPDATE deletion_requests d SET client_ids = (SELECT coalesce(array_agg(DISTINCT c), '{}') FROM (
    SELECT client_id FROM apple_identities WHERE user_id = d.user_id UNION SELECT client_id FROM apple_tokens
    WHERE user_id = d.user_id UNION SELECT app_id FROM apple_grants WHERE user_id = d.user_id) AS clients (c))
WHERE d.client_ids IS NULL;
CREATE INDEX deletion_requests_user ON deletion_requests (user_id);
