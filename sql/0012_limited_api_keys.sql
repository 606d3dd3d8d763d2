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

-- The client ids a user is in: an identity's last client id, a client id holding a token
-- for it, an app group Apple told us about (a grant).
CREATE FUNCTION broker_user_client_ids(p_user_id uuid) RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT c), '{}') FROM (
        SELECT i.client_id AS c FROM apple_identities i WHERE i.user_id = p_user_id
        UNION SELECT t.client_id FROM apple_tokens t WHERE t.user_id = p_user_id
        UNION SELECT g.app_id FROM apple_grants g WHERE g.user_id = p_user_id
    ) AS clients
$$;

-- Whether an event (its user and payload) belongs to one of these client ids.
CREATE FUNCTION broker_event_in_apps(p_user_id uuid, p_payload jsonb, p_client_ids text[]) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT (p_payload ->> 'client_id') = ANY (p_client_ids)
        OR broker_user_client_ids(p_user_id) && p_client_ids
        OR EXISTS (SELECT 1 FROM deletion_requests d WHERE d.user_id = p_user_id AND d.client_ids && p_client_ids)
$$;

CREATE FUNCTION broker_deletion_request_apps() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.client_ids := broker_user_client_ids(NEW.user_id);
    RETURN NEW;
END
$$;
CREATE TRIGGER deletion_requests_apps BEFORE INSERT ON deletion_requests
    FOR EACH ROW EXECUTE FUNCTION broker_deletion_request_apps();
UPDATE deletion_requests d SET client_ids = broker_user_client_ids(d.user_id) WHERE d.client_ids IS NULL;
CREATE INDEX deletion_requests_user ON deletion_requests (user_id);

-- The outbox of 0002, fanning out to limited subscriptions only their apps' events (an
-- unlimited subscription, client_ids NULL, costs no lookup).
CREATE OR REPLACE FUNCTION broker_emit_event(p_type text, p_user_id uuid, p_payload jsonb)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO outbox_events (type, user_id, payload)
    VALUES (p_type, p_user_id, p_payload)
    RETURNING id INTO v_id;
    INSERT INTO webhook_deliveries (event_id, subscription_id, ordering_key, next_attempt_at)
    SELECT v_id, s.id, p_user_id, CASE WHEN s.status = 'active' THEN now() ELSE 'infinity' END
    FROM webhook_subscriptions s
    WHERE (s.topics ? p_type OR s.topics ? '*')
      AND (s.client_ids IS NULL OR broker_event_in_apps(p_user_id, p_payload, s.client_ids));
    RETURN v_id;
END
$$;
