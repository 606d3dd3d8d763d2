-- 0013: revocation you can trust in both directions (issue 28; protocol reference §11).
-- Expand only: the previous release reads apple_tokens as before (a token with revoked_at
-- set is no live token to it either) and never calls the function below.

-- Why a token stopped being live: 'token_invalid' when Apple answered invalid_grant to its
-- refresh (a password change does that while the user's authorization stays, forum thread
-- 651237): the consent is kept and the user needs a fresh sign-in to store a new token.
-- NULL for the older causes (a transfer retired it). A new login's upsert clears revoked_at,
-- so "revoked_at IS NOT NULL AND revoked_reason = 'token_invalid'" is the state.
-- last_validation_error: the `kind` of the token's last failed validation, so that an
-- unworded invalid_request is counted as a revocation only when it repeats for this token
-- while others refresh (TN3107 lists request defects under the same code).
ALTER TABLE apple_tokens
    ADD COLUMN revoked_reason text,
    ADD COLUMN last_validation_error text;

-- A refresh token Apple calls dead (invalid_grant): it stops being live, the consent stays
-- as it is (no consent.revoked), and `token.invalidated` tells the app to ask for a fresh
-- sign-in. Returns false when the token was no longer live.
CREATE FUNCTION broker_invalidate_token(p_token_id uuid, p_app_id text, p_source text, p_apple_error text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_user_id uuid;
BEGIN
    UPDATE apple_tokens SET revoked_at = now(), revoked_reason = 'token_invalid',
        last_validation_error = p_apple_error
    WHERE id = p_token_id AND revoked_at IS NULL
    RETURNING user_id INTO v_user_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO audit_log (actor, action, subject, detail)
    VALUES (p_source, 'token.invalidated', v_user_id::text,
            jsonb_build_object('client_id', p_app_id, 'apple_error', p_apple_error));
    PERFORM broker_emit_event('token.invalidated', v_user_id, jsonb_build_object(
        'user_id', v_user_id, 'client_id', p_app_id, 'source', p_source, 'apple_error', p_apple_error,
        'action', 'sign_in_again'));
    RETURN true;
END
$$;
