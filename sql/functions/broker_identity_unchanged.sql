-- Whether a login with these verified facts would change nothing on this identity but
-- last_login_at, and that one is recent enough to leave alone (the read-only fast path in
-- LoginStore and broker_login agree through it). The group's consent must be active: the
-- caller joins its apple_grants row and passes whether it is revoked, because a sub-select
-- here would stop PostgreSQL from inlining the function into the login's query (it would
-- then be planned again on every login).
CREATE OR REPLACE FUNCTION broker_identity_unchanged(
    i apple_identities, p_client_id text, p_consent_revoked boolean, p_email text, p_email_verified boolean,
    p_is_private_email boolean, p_real_user_status text, p_given_name text, p_family_name text, p_user_email text,
    p_last_login_resolution interval
) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT NOT p_consent_revoked
        AND i.client_id = p_client_id
        AND (p_email IS NULL OR p_email = i.email)
        AND (p_email_verified IS NULL OR p_email_verified = i.email_verified)
        AND (p_email IS NULL OR p_is_private_email IS NULL OR p_is_private_email = i.is_private_email)
        AND (p_real_user_status IS NULL OR p_real_user_status = i.real_user_status)
        AND (p_given_name IS NULL OR i.given_name IS NOT NULL)
        AND (p_family_name IS NULL OR i.family_name IS NOT NULL)
        AND i.last_login_at IS NOT NULL AND i.last_login_at >= now() - p_last_login_resolution
$$;
