-- 0007: consent and mail forwarding belong to an app group, not to the team identity.
--
-- Apple scopes a user's authorization to a primary App ID (an app with the App IDs and
-- Services IDs grouped under it); notifications name it in `aud` (protocol reference
-- §10.2). One team identity can hold several groups' grants: a consent-revoked for app B
-- must leave app A's grant and refresh token alone. A group is named by its primary App ID
-- (`app_id`); the broker's configuration (APPLE_APP_GROUPS) says which client ids belong to
-- it and passes both to these functions. No row means the default: consent active,
-- forwarding enabled, so the common case costs one primary-key probe.
CREATE TABLE apple_grants (
    identity_id          uuid NOT NULL REFERENCES apple_identities (id) ON DELETE CASCADE,
    user_id              uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    app_id               text NOT NULL,                   -- the group's primary App ID
    consent              text NOT NULL DEFAULT 'active' CHECK (consent IN ('active', 'revoked')),
    consent_at           timestamptz,                     -- event_time of the change applied last
    email_forwarding     text NOT NULL DEFAULT 'enabled' CHECK (email_forwarding IN ('enabled', 'disabled')),
    email_forwarding_at  timestamptz,
    PRIMARY KEY (identity_id, app_id)
);
CREATE INDEX apple_grants_user_id ON apple_grants (user_id);

-- What the identity-wide columns said, kept for the app the identity used last. The broker
-- renames a member client id to its group's primary App ID at start (AppGroupsAlignment).
INSERT INTO apple_grants (identity_id, user_id, app_id, consent, consent_at, email_forwarding, email_forwarding_at)
SELECT id, user_id, client_id, consent, consent_at, email_forwarding, email_forwarding_at
FROM apple_identities
WHERE consent <> 'active' OR email_forwarding <> 'enabled' OR consent_at IS NOT NULL OR email_forwarding_at IS NOT NULL;

-- The e-mail in Apple's unsigned first-authorization `user` field is kept apart: `email`
-- comes only from a verified token (a backend linking accounts by e-mail could otherwise be
-- taken over with {"user":{"email":"victim@…"}}); the unsigned one is kept at the first
-- authorization only, as unverified_email, never marked verified.
ALTER TABLE apple_identities ADD COLUMN unverified_email text;

-- The previous versions of the functions that read the identity-wide columns (a database
-- migrated by a release before sql/functions/ has them); the live ones are in sql/functions/.
DROP FUNCTION IF EXISTS broker_apply_notification(text, text, text, text, timestamptz);
DROP FUNCTION IF EXISTS broker_revoke_consent(uuid, timestamptz, text);
DROP FUNCTION IF EXISTS broker_login(text, text, text, text, boolean, boolean, text, text, text, text, text, bytea, text, interval, interval);
DROP FUNCTION IF EXISTS broker_identity_unchanged(apple_identities, text, text, boolean, boolean, text, text, text, text, interval);
ALTER TABLE apple_identities
    DROP COLUMN consent, DROP COLUMN consent_at, DROP COLUMN email_forwarding, DROP COLUMN email_forwarding_at;

-- The refresh sweep backs off per token when Apple's answer is no verdict on it
-- (invalid_client, 5xx, timeouts): consecutive failures, reset by a verdict.
ALTER TABLE apple_tokens ADD COLUMN validation_failures integer NOT NULL DEFAULT 0;
