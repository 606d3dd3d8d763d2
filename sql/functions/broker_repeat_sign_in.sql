-- The writes of a repeat login that changes nothing else (LoginStore's fast path, issue 39),
-- in one statement and so one transaction and one commit: last_login_at and last_verified_at
-- when stale (p_touch_last_login: the two columns and values broker_login_v2 would write), and
-- the sign-in on the group's authorization timeline through its one writer,
-- broker_record_sign_in (issue 35), when newer than what the timeline knows (p_record).
-- The identity row is locked first (the UPDATE, or FOR KEY SHARE), so a purge cannot slip in
-- between it and the grant it writes. False when the identity is gone (purged meanwhile):
-- broker_login_v2 then decides.
CREATE OR REPLACE FUNCTION broker_repeat_sign_in(
    p_identity_id uuid, p_app_id text, p_signed_in_at timestamptz, p_touch_last_login boolean, p_record boolean
) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_user uuid;
BEGIN
    IF p_touch_last_login THEN
        UPDATE apple_identities SET last_login_at = now(), last_verified_at = now()
        WHERE id = p_identity_id RETURNING user_id INTO v_user;
    ELSE
        SELECT user_id INTO v_user FROM apple_identities WHERE id = p_identity_id FOR KEY SHARE;
    END IF;
    IF v_user IS NULL THEN
        RETURN false;
    END IF;
    IF p_record THEN
        PERFORM broker_record_sign_in(p_identity_id, v_user, p_app_id, p_signed_in_at);
    END IF;
    RETURN true;
END
$$;
