-- Opens a deletion request for a user, or returns the one the user already has, open or
-- dead-lettered (idempotent): the user is marked 'deleting' (logins answer 409 from now
-- on), user.deletion_requested is written to the outbox and the deletion job is woken.
--
-- v2 (issue 29 item 10): a 'failed' request is returned too, never reopened beside it; it
-- is re-driven by the retry path (POST /v1/deletions/{id}/retry, `deletions retry`). v1
-- opened a second request, and two purges meant two user.deleted. If the previous release
-- left a failed and an open request for one user, the open one is returned. Everything
-- else is v1's (called, not copied: while both releases run, v1 is the previous release's).
CREATE OR REPLACE FUNCTION broker_request_deletion_v2(p_user_id uuid, p_source text, p_reason text, p_requested_by text)
RETURNS TABLE (r_deletion_id uuid, r_created boolean) LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
BEGIN
    -- Serialise requests for the same user on the user row (v1 takes the same lock again).
    PERFORM 1 FROM users WHERE id = p_user_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT id INTO v_id FROM deletion_requests
    WHERE user_id = p_user_id AND state = 'failed'
      AND NOT EXISTS (SELECT 1 FROM deletion_requests WHERE user_id = p_user_id AND state NOT IN ('done', 'failed'))
    ORDER BY created_at DESC LIMIT 1;
    IF FOUND THEN
        r_deletion_id := v_id;
        r_created := false;
        RETURN NEXT;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM broker_request_deletion(p_user_id, p_source, p_reason, p_requested_by);
END
$$;
