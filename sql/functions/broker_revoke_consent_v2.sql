-- Revokes one app group's consent for an identity by Apple's clock (issue 35; protocol
-- reference §12.1). p_event_time is when Apple says the authorization ended: a
-- consent-revoked's event_time, or for the sweep the last time Apple vouched for the token
-- it found revoked (broker_sweep_verdict). With p_check_stale, the revocation is stale and
-- changes nothing (no token deleted, no event, no logout) when the group has a verified
-- sign-in after it, or its consent was revoked at or after it (a duplicate with a new jti;
-- consent_at of an active group is its last sign-in, which signed_in_at decides). An `iat`
-- has whole seconds, so Apple's clock cannot order a revocation and a sign-in of the same
-- second: then the later arrival wins (here the revocation; a sign-in arriving after a
-- revocation of its second restores, see broker_login_v2). Otherwise the group's refresh
-- tokens are deleted (dead at Apple), its consent is revoked as of p_event_time, and
-- consent.revoked is written when it was active; other groups are left alone.
-- Returns 'revoked', 'already_revoked' (applied; the consent was revoked before) or 'stale'.
-- v0.24.0 keeps calling broker_revoke_consent, which orders by consent_at only.
CREATE OR REPLACE FUNCTION broker_revoke_consent_v2(
    p_identity_id uuid, p_app_id text, p_client_ids text[], p_event_time timestamptz, p_source text, p_check_stale boolean
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_identity apple_identities%ROWTYPE;
    v_grant apple_grants%ROWTYPE;
    v_was_active boolean := true;
BEGIN
    SELECT * INTO v_identity FROM apple_identities WHERE id = p_identity_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'stale';
    END IF;
    SELECT * INTO v_grant FROM apple_grants WHERE identity_id = p_identity_id AND app_id = p_app_id;
    IF FOUND THEN
        IF p_check_stale AND (
            (v_grant.signed_in_at IS NOT NULL AND v_grant.signed_in_at > p_event_time)
            OR (v_grant.consent = 'revoked' AND v_grant.consent_at >= p_event_time)) THEN
            RETURN 'stale';
        END IF;
        v_was_active := v_grant.consent = 'active';
    END IF;
    DELETE FROM apple_tokens WHERE identity_id = p_identity_id AND client_id = ANY (p_client_ids);
    INSERT INTO apple_grants (identity_id, user_id, app_id, consent, consent_at)
    VALUES (p_identity_id, v_identity.user_id, p_app_id, 'revoked', p_event_time)
    ON CONFLICT (identity_id, app_id) DO UPDATE SET consent = 'revoked',
        consent_at = CASE WHEN apple_grants.consent = 'revoked' THEN GREATEST(apple_grants.consent_at, EXCLUDED.consent_at)
                          ELSE EXCLUDED.consent_at END;
    IF v_was_active THEN
        PERFORM broker_emit_event('consent.revoked', v_identity.user_id, jsonb_build_object(
            'user_id', v_identity.user_id, 'client_id', p_app_id, 'source', p_source));
        RETURN 'revoked';
    END IF;
    RETURN 'already_revoked';
END
$$;
