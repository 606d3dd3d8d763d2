-- Version 2 (issue 35) of broker_identity_unchanged, for broker_login_v2 and LoginStore's
-- read-only fast path: a `user` field's name or e-mail that differs from the stored one is a
-- change (its presence is Apple's sign of a first authorization, which replaces the name;
-- protocol reference §12), and so is an `org_id` the token no longer carries. The group's
-- consent must be active: the caller passes whether its grant is revoked, because a
-- sub-select here would stop PostgreSQL from inlining the function into the login's query.
-- Never NULL: broker_login_v2 writes when it is false.
CREATE OR REPLACE FUNCTION broker_identity_unchanged_v2(
    i apple_identities, p_client_id text, p_consent_revoked boolean, p_email text, p_email_verified boolean,
    p_is_private_email boolean, p_real_user_status text, p_given_name text, p_family_name text, p_user_email text,
    p_org_id text, p_last_login_resolution interval
) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT NOT p_consent_revoked
        AND i.client_id = p_client_id
        AND (p_email IS NULL OR p_email = i.email)
        AND (p_email_verified IS NULL OR p_email_verified = i.email_verified)
        AND (p_email IS NULL OR p_is_private_email IS NULL OR p_is_private_email = i.is_private_email)
        AND (p_real_user_status IS NULL OR p_real_user_status = i.real_user_status)
        AND (p_given_name IS NULL OR p_given_name IS NOT DISTINCT FROM i.given_name)
        AND (p_family_name IS NULL OR p_family_name IS NOT DISTINCT FROM i.family_name)
        AND (p_user_email IS NULL OR p_user_email IS NOT DISTINCT FROM coalesce(p_email, i.email)
             OR p_user_email IS NOT DISTINCT FROM i.unverified_email)
        AND i.org_id IS NOT DISTINCT FROM p_org_id
        AND i.last_login_at IS NOT NULL AND i.last_login_at >= now() - p_last_login_resolution
$$;
