-- A refresh token Apple calls dead (invalid_grant), or one whose authorization a later
-- sign-in superseded (broker_sweep_verdict): it stops being live, the consent stays as it is
-- (no consent.revoked), and `token.invalidated` tells the app to ask for a fresh sign-in.
-- The event names the authorization the token came from (`authorized_at`, Apple's time) and,
-- when the user has signed in to the group since (`signed_in_since`), that sign-in: sessions
-- built on the later sign-in stay (the provider ends only older grants, broker_oidc_end_grants).
-- Returns false when the token was no longer live.
CREATE OR REPLACE FUNCTION broker_invalidate_token(p_token_id uuid, p_app_id text, p_source text, p_apple_error text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_token apple_tokens%ROWTYPE;
    v_authorized_at timestamptz;
    v_since timestamptz;
BEGIN
    UPDATE apple_tokens SET revoked_at = now(), revoked_reason = 'token_invalid',
        last_validation_error = p_apple_error
    WHERE id = p_token_id AND revoked_at IS NULL
    RETURNING * INTO v_token;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    v_authorized_at := broker_token_authorized_at(v_token);
    v_since := broker_signed_in_since(v_token.identity_id, p_app_id, v_authorized_at);
    INSERT INTO audit_log (actor, action, subject, detail)
    VALUES (p_source, 'token.invalidated', v_token.user_id::text,
            jsonb_build_object('client_id', p_app_id, 'apple_error', p_apple_error, 'superseded', v_since IS NOT NULL));
    PERFORM broker_emit_event('token.invalidated', v_token.user_id, jsonb_build_object(
        'user_id', v_token.user_id, 'client_id', p_app_id, 'source', p_source, 'apple_error', p_apple_error,
        'action', 'sign_in_again', 'authorized_at', v_authorized_at, 'signed_in_since', v_since));
    RETURN true;
END
$$;
