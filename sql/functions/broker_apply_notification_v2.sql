-- Version 2 (issue 35): a consent-revoked is ordered by Apple's clock against the group's
-- verified sign-ins (broker_revoke_consent_v2): one whose event_time is before the group's
-- last sign-in is `stale` and changes nothing, so a late, retried or duplicated
-- delivery (protocol reference §10.7, §12.1) never revokes a user who signed in again.
-- Otherwise as broker_apply_notification, which v0.24.0 keeps calling, and with what the
-- broker used to send in further statements of a transaction, so a notification is one
-- statement (one round trip, its own transaction: pgbench's apply ran 2x the broker's
-- notifications with four): p_client_id, the `aud` it matched, goes into the inbox row
-- (sql/0019; a duplicate changes nothing), and an applied email-disabled/-enabled that
-- carries the address (p_email, p_is_private_email; Apple news j5j9ep1b, 2025-10-09,
-- protocol reference §11.8) replaces the identity's, unless a sign-in verified a newer
-- state (a second's grace: event times may come in whole seconds), with identity.updated.
-- Applies one verified notification exactly once (the inbox is keyed by jti) and returns
-- what happened: duplicate, applied, stale (an older event than the state it would
-- overwrite), unknown_subject, unknown_type. Per attribute, the event_time of the change
-- applied last is kept, so events arriving out of order end in the newest state.
-- The notification applies to the group its `aud` names (p_app_id, protocol reference
-- §10.2): email-disabled/-enabled and consent-revoked change that group's grant only;
-- account-delete stays user-wide (Apple deleted the Apple Account). p_sub_hash is the keyed
-- hash of the sub (SubjectHasher); nothing in SQL hashes a sub.
-- The inbox row is written last, once the outcome is known: a concurrent duplicate
-- blocks on its primary key until this transaction ends and then fails with 23505,
-- which rolls back everything it did; the caller answers that as a duplicate.
CREATE OR REPLACE FUNCTION broker_apply_notification_v2(
    p_jti text, p_type text, p_team_id text, p_sub text, p_event_time timestamptz, p_app_id text, p_client_ids text[], p_sub_hash text,
    p_client_id text, p_email text, p_is_private_email boolean
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_identity apple_identities%ROWTYPE;
    v_grant apple_grants%ROWTYPE;
    v_has_grant boolean;
    v_sub_hash text := p_sub_hash;
    v_outcome text;
    v_forwarding text;
    v_email_verified boolean;
BEGIN
    IF EXISTS (SELECT 1 FROM apple_notifications WHERE jti = p_jti) THEN
        RETURN 'duplicate';
    END IF;

    SELECT * INTO v_identity FROM apple_identities WHERE team_id = p_team_id AND sub = p_sub FOR UPDATE;
    IF NOT FOUND THEN
        v_outcome := 'unknown_subject';
    ELSE
        SELECT * INTO v_grant FROM apple_grants WHERE identity_id = v_identity.id AND app_id = p_app_id;
        v_has_grant := FOUND;
        IF p_type IN ('email-disabled', 'email-enabled') THEN
            v_forwarding := CASE p_type WHEN 'email-disabled' THEN 'disabled' ELSE 'enabled' END;
            IF v_has_grant AND v_grant.email_forwarding_at IS NOT NULL AND v_grant.email_forwarding_at >= p_event_time THEN
                v_outcome := 'stale';
            ELSE
                INSERT INTO apple_grants (identity_id, user_id, app_id, email_forwarding, email_forwarding_at)
                VALUES (v_identity.id, v_identity.user_id, p_app_id, v_forwarding, p_event_time)
                ON CONFLICT (identity_id, app_id) DO UPDATE
                SET email_forwarding = EXCLUDED.email_forwarding, email_forwarding_at = EXCLUDED.email_forwarding_at;
                IF COALESCE(v_grant.email_forwarding, 'enabled') IS DISTINCT FROM v_forwarding THEN
                    PERFORM broker_emit_event('email.forwarding_' || v_forwarding, v_identity.user_id, jsonb_build_object(
                        'user_id', v_identity.user_id, 'client_id', p_app_id,
                        'is_private_email', v_identity.is_private_email, 'event_time', p_event_time));
                END IF;
                v_outcome := 'applied';
                IF p_email IS NOT NULL THEN
                    UPDATE apple_identities SET email = p_email, is_private_email = COALESCE(p_is_private_email, false)
                    WHERE id = v_identity.id
                      AND (last_verified_at IS NULL OR last_verified_at < p_event_time + interval '1 second')
                      AND (email IS DISTINCT FROM p_email OR is_private_email IS DISTINCT FROM COALESCE(p_is_private_email, false))
                    RETURNING email_verified INTO v_email_verified;
                    IF FOUND THEN
                        PERFORM broker_emit_event('identity.updated', v_identity.user_id, jsonb_build_object(
                            'user_id', v_identity.user_id, 'changed', jsonb_build_array('email'),
                            'email_verified', v_email_verified, 'is_private_email', COALESCE(p_is_private_email, false),
                            'source', 'apple'));
                    END IF;
                END IF;
            END IF;
        ELSIF p_type = 'consent-revoked' THEN
            v_outcome := CASE broker_revoke_consent_v2(v_identity.id, p_app_id, p_client_ids, p_event_time, 'apple', true)
                WHEN 'stale' THEN 'stale' ELSE 'applied' END;
        ELSIF p_type IN ('account-delete', 'account-deleted') THEN
            PERFORM broker_request_deletion(v_identity.user_id, 'apple', 'apple account deleted', 'apple');
            v_outcome := 'applied';
        ELSE
            v_outcome := 'unknown_type';
        END IF;
    END IF;

    INSERT INTO apple_notifications (jti, event_type, sub_hash, event_time, outcome, client_id)
    VALUES (p_jti, p_type, v_sub_hash, p_event_time, v_outcome, p_client_id);
    INSERT INTO audit_log (actor, action, subject, detail)
    VALUES ('apple', 'notification.' || p_type, v_sub_hash,
            jsonb_build_object('jti', p_jti, 'outcome', v_outcome, 'client_id', p_app_id));
    RETURN v_outcome;
END
$$;
