-- Marks one group's consent revoked for an identity (a consent-revoked notification for
-- that group, or a refresh Apple answers as a revoked grant): deletes the identity's
-- refresh tokens of the group's client ids, which are dead at Apple, leaves the other
-- groups' alone, and emits consent.revoked naming the group. A change issued at or before
-- the group's last applied change is ignored. Returns true when consent was active.
CREATE OR REPLACE FUNCTION broker_revoke_consent(
    p_identity_id uuid, p_app_id text, p_client_ids text[], p_event_time timestamptz, p_source text
) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_identity apple_identities%ROWTYPE;
    v_grant apple_grants%ROWTYPE;
    v_was_active boolean;
BEGIN
    SELECT * INTO v_identity FROM apple_identities WHERE id = p_identity_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT * INTO v_grant FROM apple_grants WHERE identity_id = p_identity_id AND app_id = p_app_id;
    IF FOUND THEN
        IF v_grant.consent_at IS NOT NULL AND v_grant.consent_at >= p_event_time THEN
            RETURN false;
        END IF;
        v_was_active := v_grant.consent = 'active';
    ELSE
        v_was_active := true;
    END IF;
    DELETE FROM apple_tokens WHERE identity_id = p_identity_id AND client_id = ANY (p_client_ids);
    INSERT INTO apple_grants (identity_id, user_id, app_id, consent, consent_at)
    VALUES (p_identity_id, v_identity.user_id, p_app_id, 'revoked', p_event_time)
    ON CONFLICT (identity_id, app_id) DO UPDATE SET consent = 'revoked', consent_at = EXCLUDED.consent_at;
    IF v_was_active THEN
        PERFORM broker_emit_event('consent.revoked', v_identity.user_id, jsonb_build_object(
            'user_id', v_identity.user_id, 'client_id', p_app_id, 'source', p_source));
    END IF;
    RETURN v_was_active;
END
$$;
