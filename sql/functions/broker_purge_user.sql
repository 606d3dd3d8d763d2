-- Purges a deletion request's user in one transaction, once: tombstones (the keyed hashes
-- it is given) for each identity, the user row deleted (identities and tokens cascade
-- away), the request marked done and its authorization code cleared, a step and an audit
-- record, and user.deleted (with what happened at Apple) in the outbox. A request that is
-- not in 'purging' (already done by another worker, say) is left alone: returns false.
CREATE OR REPLACE FUNCTION broker_purge_user(p_deletion_id uuid, p_team_ids text[], p_sub_hashes text[]) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_request deletion_requests%ROWTYPE;
    v_identities integer;
BEGIN
    SELECT * INTO v_request FROM deletion_requests WHERE id = p_deletion_id FOR UPDATE;
    IF NOT FOUND OR v_request.state <> 'purging' THEN
        RETURN false;
    END IF;
    -- One keyed hash per identity, computed by the job from the identities it read: if one
    -- was added since, the purge is refused (and retried) rather than leave it untombstoned.
    SELECT count(*) INTO v_identities FROM apple_identities i WHERE i.user_id = v_request.user_id;
    IF v_identities <> coalesce(cardinality(p_sub_hashes), 0) THEN
        RAISE EXCEPTION 'the user''s identities changed during the deletion' USING ERRCODE = '40001';
    END IF;
    INSERT INTO tombstones (deletion_id, team_id, sub_hash, user_id, reason, requested_by)
    SELECT p_deletion_id, h.team_id, h.sub_hash, v_request.user_id, v_request.reason, v_request.requested_by
    FROM unnest(p_team_ids, p_sub_hashes) AS h (team_id, sub_hash)
    ON CONFLICT DO NOTHING;
    DELETE FROM users WHERE id = v_request.user_id;
    UPDATE deletion_requests SET state = 'done', completed_at = now(), updated_at = now(), last_error = NULL,
        authorization_code = NULL, code_key_id = NULL, code_client_id = NULL, code_redirect_uri = NULL
    WHERE id = p_deletion_id;
    INSERT INTO deletion_steps (deletion_id, step, outcome, detail)
    VALUES (p_deletion_id, 'purge', 'done', v_identities || ' identities tombstoned');
    INSERT INTO audit_log (actor, action, subject, deletion_id, detail)
    VALUES ('deletion-job', 'deletion.purged', v_request.user_id::text, p_deletion_id,
            jsonb_build_object('identities', v_identities, 'source', v_request.source,
                               'apple_revocation', v_request.apple_revocation));
    PERFORM broker_emit_event('user.deleted', v_request.user_id, jsonb_build_object(
        'user_id', v_request.user_id, 'deletion_id', p_deletion_id, 'source', v_request.source,
        'apple_revocation', v_request.apple_revocation));
    RETURN true;
END
$$;
