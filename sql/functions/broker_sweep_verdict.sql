-- Applies the refresh sweep's verdict on one stored token (issue 35; protocol reference
-- §12.1, §12.2). A verdict is about the authorization the token came from:
--   * 'revoked' (Apple's words: the user revoked the app): when the token's authorization is
--     the group's newest, the group's consent is revoked as of the last time Apple vouched for
--     the token (its authorization or its last good refresh; Apple's answer says the
--     revocation came after that, not when), with consent.revoked; when the user has signed
--     in to the group since (broker_signed_in_since), that later sign-in proves the
--     authorization now, so only this token ends ('superseded');
--   * 'token_invalid' (invalid_grant, or an unworded invalid_request repeated on this token):
--     this token ends, the consent stays.
-- A token that ends gets token.invalidated (broker_invalidate_token). p_refresh_token is the
-- sealed token the verdict is about: a login may have replaced it meanwhile (same row), and
-- Apple's answer says nothing about the new one. The identity is locked first, as logins and
-- notifications do. Returns 'revoked', 'already_revoked', 'superseded', 'token_invalid', or
-- 'gone' when that token is no longer stored and live.
CREATE OR REPLACE FUNCTION broker_sweep_verdict(
    p_token_id uuid, p_refresh_token bytea, p_app_id text, p_client_ids text[], p_verdict text, p_apple_error text
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_token apple_tokens%ROWTYPE;
    v_authorized_at timestamptz;
BEGIN
    IF p_verdict NOT IN ('revoked', 'token_invalid') THEN
        RAISE EXCEPTION 'unknown verdict %', p_verdict;
    END IF;
    PERFORM 1 FROM apple_identities WHERE id = (SELECT identity_id FROM apple_tokens WHERE id = p_token_id) FOR UPDATE;
    SELECT * INTO v_token FROM apple_tokens
    WHERE id = p_token_id AND revoked_at IS NULL AND refresh_token = p_refresh_token FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'gone';
    END IF;
    v_authorized_at := broker_token_authorized_at(v_token);
    IF p_verdict = 'revoked' THEN
        IF broker_signed_in_since(v_token.identity_id, p_app_id, v_authorized_at) IS NULL THEN
            RETURN broker_revoke_consent_v2(v_token.identity_id, p_app_id, p_client_ids,
                GREATEST(v_authorized_at, v_token.last_validated_at), 'refresh_sweep', false);
        END IF;
        RETURN CASE WHEN broker_invalidate_token(p_token_id, p_app_id, 'refresh_sweep', p_apple_error)
            THEN 'superseded' ELSE 'gone' END;
    END IF;
    RETURN CASE WHEN broker_invalidate_token(p_token_id, p_app_id, 'refresh_sweep', p_apple_error)
        THEN 'token_invalid' ELSE 'gone' END;
END
$$;
