-- A refresh token Apple calls dead (invalid_grant): it stops being live, the consent stays
-- as it is (no consent.revoked), and `token.invalidated` tells the app to ask for a fresh
-- sign-in. Returns false when the token was no longer live.
CREATE OR REPLACE FUNCTION broker_invalidate_token(p_token_id uuid, p_app_id text, p_source text, p_apple_error text)
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
