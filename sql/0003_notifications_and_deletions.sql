-- 0003: Apple's server-to-server notifications and deletion requests.

-- Opens a deletion request for a user, or returns the one already open (idempotent):
-- the user is marked 'deleting' (logins answer 409 from now on), user.deletion_requested
-- is written to the outbox and the deletion job is woken.
CREATE FUNCTION broker_request_deletion(p_user_id uuid, p_source text, p_reason text, p_requested_by text)
RETURNS TABLE (r_deletion_id uuid, r_created boolean) LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
BEGIN
    -- Serialise requests for the same user on the user row.
    PERFORM 1 FROM users WHERE id = p_user_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT id INTO v_id FROM deletion_requests WHERE user_id = p_user_id AND state NOT IN ('done', 'failed');
    IF FOUND THEN
        r_deletion_id := v_id;
        r_created := false;
        RETURN NEXT;
        RETURN;
    END IF;
    v_id := gen_random_uuid();
    INSERT INTO deletion_requests (id, user_id, source, reason, requested_by) VALUES (v_id, p_user_id, p_source, p_reason, p_requested_by);
    UPDATE users SET status = 'deleting', updated_at = now() WHERE id = p_user_id;
    INSERT INTO audit_log (actor, action, subject, deletion_id, detail)
    VALUES (p_source || ':' || p_requested_by, 'deletion.requested', p_user_id::text, v_id,
            jsonb_build_object('source', p_source, 'reason', p_reason));
    PERFORM broker_emit_event('user.deletion_requested', p_user_id, jsonb_build_object(
        'user_id', p_user_id, 'deletion_id', v_id, 'source', p_source));
    PERFORM pg_notify('deletion_requested', '');
    r_deletion_id := v_id;
    r_created := true;
    RETURN NEXT;
END
$$;

-- Applies one verified notification exactly once (the inbox is keyed by jti) and returns
-- what happened: duplicate, applied, stale (an older event than the state it would
-- overwrite), unknown_subject, unknown_type. Per attribute, the event_time of the change
-- applied last is kept, so events arriving out of order end in the newest state.
-- The inbox row is written last, once the outcome is known: a concurrent duplicate
-- blocks on its primary key until this transaction ends and then fails with 23505,
-- which rolls back everything it did; the caller answers that as a duplicate.
CREATE FUNCTION broker_apply_notification(
    p_jti text, p_type text, p_team_id text, p_sub text, p_event_time timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_identity apple_identities%ROWTYPE;
    v_sub_hash text := encode(sha256(convert_to(p_sub, 'UTF8')), 'hex');
    v_outcome text;
    v_forwarding text;
BEGIN
    IF EXISTS (SELECT 1 FROM apple_notifications WHERE jti = p_jti) THEN
        RETURN 'duplicate';
    END IF;

    SELECT * INTO v_identity FROM apple_identities WHERE team_id = p_team_id AND sub = p_sub FOR UPDATE;
    IF NOT FOUND THEN
        v_outcome := 'unknown_subject';
    ELSIF p_type IN ('email-disabled', 'email-enabled') THEN
        v_forwarding := CASE p_type WHEN 'email-disabled' THEN 'disabled' ELSE 'enabled' END;
        IF v_identity.email_forwarding_at IS NOT NULL AND v_identity.email_forwarding_at >= p_event_time THEN
            v_outcome := 'stale';
        ELSE
            UPDATE apple_identities SET email_forwarding = v_forwarding, email_forwarding_at = p_event_time
            WHERE id = v_identity.id;
            IF v_identity.email_forwarding IS DISTINCT FROM v_forwarding THEN
                PERFORM broker_emit_event('email.forwarding_' || v_forwarding, v_identity.user_id, jsonb_build_object(
                    'user_id', v_identity.user_id, 'client_id', v_identity.client_id,
                    'is_private_email', v_identity.is_private_email, 'event_time', p_event_time));
            END IF;
            v_outcome := 'applied';
        END IF;
    ELSIF p_type = 'consent-revoked' THEN
        IF v_identity.consent_at IS NOT NULL AND v_identity.consent_at >= p_event_time THEN
            v_outcome := 'stale';
        ELSE
            PERFORM broker_revoke_consent(v_identity.id, p_event_time, 'apple');
            v_outcome := 'applied';
        END IF;
    ELSIF p_type IN ('account-delete', 'account-deleted') THEN
        PERFORM broker_request_deletion(v_identity.user_id, 'apple', 'apple account deleted', 'apple');
        v_outcome := 'applied';
    ELSE
        v_outcome := 'unknown_type';
    END IF;

    INSERT INTO apple_notifications (jti, event_type, sub_hash, event_time, outcome)
    VALUES (p_jti, p_type, v_sub_hash, p_event_time, v_outcome);
    INSERT INTO audit_log (actor, action, subject, detail)
    VALUES ('apple', 'notification.' || p_type, v_sub_hash, jsonb_build_object('jti', p_jti, 'outcome', v_outcome));
    RETURN v_outcome;
END
$$;
