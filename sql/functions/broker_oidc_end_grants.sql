-- The OpenID Provider's reaction to Apple's events (issue 27): an outbox event that ends a
-- user's relationship with the app ends their OIDC grants in the same transaction (access and
-- refresh tokens stop working at once) and queues a Back-Channel Logout delivery for every RP
-- holding one. A trigger, so the event's writer needs no knowledge of the provider, whichever
-- release wrote it: `consent.revoked` for the grant's app group (payload client_id is the
-- group's primary App ID), `user.deletion_requested` (Apple's account-delete or a compliance
-- request) and `user.deleted` (a purge; grants are normally ended at the request already).
-- `token.invalidated` too (issue 35, protocol reference §12.4: Apple's "sign in again" ends
-- the sessions built on that authorization): the group's grants end, except, when the user
-- has signed in to the group since the dead token's authorization (payload `signed_in_since`,
-- Apple's time), the grants made at or after that sign-in (a minute's grace for the two
-- clocks: a grant is made right after the sign-in it rests on).
-- The same events end the user's sessions at the provider (sql/0023), so no browser signs
-- in silently afterwards: a `token.invalidated` those whose Apple authentication (auth_time)
-- is older than the later sign-in, as for grants.
-- Queued deliveries NOTIFY oidc_logout_due, which wakes the logout lane in every process that
-- runs it (LogoutDeliveryStore.dueChannel): these events are rare, so the notifying commit's
-- lock costs nothing that matters (unlike broker_emit_event's, on every login).
-- Declared in Swift where both owners can read it: BrokerCore's EventFeed (outbox_events) and
-- the provider's LogoutDeliveryStore (what it writes).
-- The trigger is created when missing or when its event list is not this one (the provider
-- is unreleased; a changed list is replaced once), never on every start (see
-- audit_log_append_only.sql).
CREATE OR REPLACE FUNCTION broker_oidc_end_grants() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_queued bigint;
BEGIN
    IF NEW.user_id IS NULL THEN
        RETURN NULL;
    END IF;
    UPDATE oidc_sessions SET ended_at = now(), end_reason = NEW.type
    WHERE user_id = NEW.user_id AND ended_at IS NULL
      AND (NEW.type NOT IN ('consent.revoked', 'token.invalidated') OR app_id = NEW.payload->>'client_id')
      AND (NEW.type <> 'token.invalidated' OR NEW.payload->>'signed_in_since' IS NULL
           OR auth_time < (NEW.payload->>'signed_in_since')::timestamptz - interval '1 minute');
    WITH ended AS (
        UPDATE oidc_grants SET ended_at = now(), end_reason = NEW.type
        WHERE user_id = NEW.user_id AND ended_at IS NULL
          AND (NEW.type NOT IN ('consent.revoked', 'token.invalidated') OR app_id = NEW.payload->>'client_id')
          AND (NEW.type <> 'token.invalidated' OR NEW.payload->>'signed_in_since' IS NULL
               OR auth_time < (NEW.payload->>'signed_in_since')::timestamptz - interval '1 minute')
        RETURNING id, client_id, user_id, sid
    ), tokens AS (
        DELETE FROM oidc_tokens t USING ended e WHERE t.grant_id = e.id
    )
    INSERT INTO oidc_logout_deliveries (client_id, url, sub, sid, reason)
    SELECT DISTINCT ON (c.client_id, CASE WHEN c.backchannel_logout_session_required THEN e.sid END)
           c.client_id, c.backchannel_logout_uri, e.user_id,
           CASE WHEN c.backchannel_logout_session_required THEN e.sid END, NEW.type
    FROM ended e JOIN oidc_clients c ON c.client_id = e.client_id
    WHERE c.backchannel_logout_uri IS NOT NULL;
    GET DIAGNOSTICS v_queued = ROW_COUNT;
    IF v_queued > 0 THEN
        PERFORM pg_notify('oidc_logout_due', '');
    END IF;
    RETURN NULL;
END
$$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'broker_oidc_end_grants' AND tgrelid = 'outbox_events'::regclass
                   AND pg_get_triggerdef(oid) LIKE '%token.invalidated%') THEN
        DROP TRIGGER IF EXISTS broker_oidc_end_grants ON outbox_events;
        CREATE TRIGGER broker_oidc_end_grants AFTER INSERT ON outbox_events
            FOR EACH ROW WHEN (NEW.type IN ('consent.revoked', 'token.invalidated', 'user.deletion_requested', 'user.deleted'))
            EXECUTE FUNCTION broker_oidc_end_grants();
    END IF;
END $$;
