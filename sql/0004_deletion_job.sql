-- 0004: the deletion job's purge.

-- Purges a deletion request's user in one transaction, once: tombstones (hashed sub) for
-- each identity, the user row deleted (identities and tokens cascade away), the request
-- marked done, a step and an audit record, and user.deleted in the outbox. A request that
-- is not in 'purging' (already done by another worker, say) is left alone: returns false.
CREATE FUNCTION broker_purge_user(p_deletion_id uuid) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_request deletion_requests%ROWTYPE;
    v_identities integer;
BEGIN
    SELECT * INTO v_request FROM deletion_requests WHERE id = p_deletion_id FOR UPDATE;
    IF NOT FOUND OR v_request.state <> 'purging' THEN
        RETURN false;
    END IF;
    INSERT INTO tombstones (deletion_id, team_id, sub_hash, user_id, reason, requested_by)
    SELECT p_deletion_id, i.team_id, encode(sha256(convert_to(i.sub, 'UTF8')), 'hex'), i.user_id,
           v_request.reason, v_request.requested_by
    FROM apple_identities i WHERE i.user_id = v_request.user_id
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_identities = ROW_COUNT;
    DELETE FROM users WHERE id = v_request.user_id;
    UPDATE deletion_requests SET state = 'done', completed_at = now(), updated_at = now(), last_error = NULL
    WHERE id = p_deletion_id;
    INSERT INTO deletion_steps (deletion_id, step, outcome, detail)
    VALUES (p_deletion_id, 'purge', 'done', v_identities || ' identities tombstoned');
    INSERT INTO audit_log (actor, action, subject, deletion_id, detail)
    VALUES ('deletion-job', 'deletion.purged', v_request.user_id::text, p_deletion_id,
            jsonb_build_object('identities', v_identities, 'source', v_request.source));
    PERFORM broker_emit_event('user.deleted', v_request.user_id, jsonb_build_object(
        'user_id', v_request.user_id, 'deletion_id', p_deletion_id, 'source', v_request.source));
    RETURN true;
END
$$;
