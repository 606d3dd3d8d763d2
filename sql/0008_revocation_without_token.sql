-- 0008: deleting a user the broker holds no refresh token for (protocol reference §10.3).
--
-- Apple's answer (revoke-tokens documentation, TN3194): obtain tokens by validating a fresh
-- authorization code (the app's "delete my account" screen re-authenticates), and if there
-- is none, tell the user to stop using Sign in with Apple for the app by hand.

-- A code handed over with the request, sealed like refresh tokens (AES-256-GCM under
-- TOKEN_ENCRYPTION_KEY, bound to the user): a bearer secret for five minutes, cleared as
-- soon as the job has exchanged it, and at the purge. What the deletion came to at Apple is
-- kept (no personal data): revoked, already_invalid, skipped_apple_initiated, manual_required.
ALTER TABLE deletion_requests
    ADD COLUMN authorization_code bytea,
    ADD COLUMN code_key_id text,
    ADD COLUMN code_client_id text,
    ADD COLUMN code_redirect_uri text,
    ADD COLUMN apple_revocation text
        CHECK (apple_revocation IN ('revoked', 'already_invalid', 'skipped_apple_initiated', 'manual_required'));

-- The access token of a code exchange, sealed like the refresh token and kept until it
-- expires: Apple's revoke accepts both, and revoking ends the grant either way.
ALTER TABLE apple_tokens
    ADD COLUMN access_token bytea,
    ADD COLUMN access_key_id text,
    ADD COLUMN access_expires_at timestamptz;

-- The purge of 0004, now also telling in user.deleted what happened at Apple, and leaving
-- no code behind.
CREATE OR REPLACE FUNCTION broker_purge_user(p_deletion_id uuid) RETURNS boolean LANGUAGE plpgsql AS $$
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
