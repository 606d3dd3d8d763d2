-- The authorization timeline's one writer for sign-ins (issue 35; protocol reference §12.1):
-- Apple vouched for the user's authorization of an app group at p_signed_in_at, in Apple's
-- time (the `iat` of an identity token a login verified, or of the id_token a code exchange
-- just returned). It advances the group's signed_in_at and, while the consent is active,
-- consent_at with it: a consent-revoked from before the sign-in is then stale for this
-- release's functions and for v0.24.0's too, which compare consent_at alone (docs/database.md,
-- "Rolling upgrade"). Time never moves back: a token that reaches the broker late records
-- nothing when a newer sign-in is known. A revoked group is restored by broker_login_v2, not
-- here. Called by broker_login_v2 and by LoginStore's read-only fast path. True when it wrote.
CREATE OR REPLACE FUNCTION broker_record_sign_in(
    p_identity_id uuid, p_user_id uuid, p_app_id text, p_signed_in_at timestamptz
) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO apple_grants AS g (identity_id, user_id, app_id, consent_at, signed_in_at)
    VALUES (p_identity_id, p_user_id, p_app_id, p_signed_in_at, p_signed_in_at)
    ON CONFLICT (identity_id, app_id) DO UPDATE SET
        signed_in_at = EXCLUDED.signed_in_at,
        consent_at = CASE WHEN g.consent = 'active' THEN GREATEST(g.consent_at, EXCLUDED.signed_in_at)
                          ELSE g.consent_at END
    WHERE g.signed_in_at IS NULL OR g.signed_in_at < EXCLUDED.signed_in_at;
    RETURN FOUND;
END
$$;
