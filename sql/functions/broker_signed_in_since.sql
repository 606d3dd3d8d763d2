-- Whether the user signed in to this app group again after the authorization a refresh token
-- came from (issue 35; protocol reference §12.1): the group's last verified sign-in
-- (apple_grants.signed_in_at, Apple's time) when it is at least a second later than
-- p_authorized_at, else NULL. `iat` has whole seconds, so a sign-in of the same second is the
-- same authorization. A sweep verdict on a token whose authorization a later sign-in
-- superseded ends that token only (broker_sweep_verdict), and the provider ends only the
-- grants from before that sign-in (broker_oidc_end_grants).
CREATE OR REPLACE FUNCTION broker_signed_in_since(p_identity_id uuid, p_app_id text, p_authorized_at timestamptz)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT g.signed_in_at FROM apple_grants g
    WHERE g.identity_id = p_identity_id AND g.app_id = p_app_id
      AND g.signed_in_at >= coalesce(p_authorized_at, '-infinity'::timestamptz) + interval '1 second'
$$;
