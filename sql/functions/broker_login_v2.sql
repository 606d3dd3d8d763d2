-- Version 2 (issue 35; protocol reference §12) of broker_login, which v0.24.0 keeps calling.
-- What changed:
--   * every verified sign-in is put on the group's authorization timeline in Apple's time,
--     p_signed_in_at (the token's `iat`, or the id_token of a code Apple just exchanged):
--     broker_record_sign_in; a restore writes that time as consent_at, never now();
--   * a sign-in older than the group's revocation (p_signed_in_at before consent_at, a
--     second's grace) restores nothing and writes nothing: 'predates_revocation';
--   * the refresh token records the sign-in it came from (authorized_at);
--   * a `user` field's name replaces the stored one and its e-mail, when not the token's, is
--     kept as unverified_email, whenever Apple sends it: its presence is Apple's sign of a
--     first authorization, also after a revocation the broker missed;
--   * org_id is the token's: kept, replaced, or cleared when the token stops carrying it;
--   * the identity row is locked first, as notifications and the sweep's verdicts do.
-- v1: The login upsert, in one statement (one round trip, one transaction):
-- v1:   * an identity of a user whose deletion is pending is not touched ('deletion_pending');
-- v1:   * a first login creates the user and the identity (a concurrent first login of the same
-- v1:     sub loses the insert race and continues as a repeat login: one user either way); a
-- v1:     token with transfer_sub joins the user that owned the old sub; the unsigned `user`
-- v1:     e-mail is kept apart as unverified_email (first authorization only);
-- v1:   * a repeat login updates what changed: e-mail and flags from the verified token win,
-- v1:     names are only ever filled in, consent is re-activated for the login's group only
-- v1:     (p_app_id); last_login_at is rewritten only when older than p_last_login_resolution,
-- v1:     so busy repeat logins do not write;
-- v1:   * a refresh token, when given (already encrypted), replaces the one stored for the
-- v1:     identity and client id;
-- v1:   * a new user whose sub has a tombstone (p_sub_hashes: keyed hashes) is audited;
-- v1:   * outbox events: user.created, identity.linked, identity.updated, consent.restored.
-- v1: The common case, a repeat login that changes nothing, does not call this at all:
-- v1: LoginStore answers it from one read-only query (see broker_identity_unchanged).
CREATE OR REPLACE FUNCTION broker_login_v2(
    p_team_id text, p_sub text, p_client_id text, p_app_id text,
    p_email text, p_email_verified boolean, p_is_private_email boolean, p_real_user_status text,
    p_given_name text, p_family_name text, p_user_email text, p_transfer_sub text,
    p_refresh_token bytea, p_refresh_key_id text,
    p_last_login_resolution interval, p_validation_jitter interval, p_sub_hashes text[],
    p_org_id text, p_signed_in_at timestamptz, p_token_authorized_at timestamptz
) RETURNS TABLE (
    r_outcome text, r_user_id uuid, r_is_new_user boolean, r_email text, r_email_verified boolean,
    r_is_private_email boolean, r_real_user_status text, r_refresh_token_stored boolean, r_unverified_email text
) LANGUAGE plpgsql AS $$
DECLARE
    v_identity record;
    v_status text;
    v_has_token boolean := false;
    v_user uuid;
    v_new_user_id uuid;
    v_new_user boolean := false;
    v_created boolean := false;
    v_email_changed boolean;
    v_restored boolean;
    v_revoked_at timestamptz;
BEGIN
    SELECT i.*, u.status AS user_status,
           EXISTS (SELECT 1 FROM apple_tokens t WHERE t.identity_id = i.id AND t.revoked_at IS NULL) AS has_token,
           broker_identity_unchanged_v2(i, p_client_id, g.identity_id IS NOT NULL, p_email, p_email_verified, p_is_private_email,
               p_real_user_status, p_given_name, p_family_name, p_user_email, p_org_id, p_last_login_resolution) AS unchanged,
           g.consent_at AS revoked_at
    INTO v_identity
    FROM apple_identities i JOIN users u ON u.id = i.user_id
    LEFT JOIN apple_grants g ON g.identity_id = i.id AND g.app_id = p_app_id AND g.consent = 'revoked'
    WHERE i.team_id = p_team_id AND i.sub = p_sub
    FOR UPDATE OF i;
    IF FOUND THEN
        v_status := v_identity.user_status;
        v_has_token := v_identity.has_token;
        v_revoked_at := v_identity.revoked_at;
    ELSE
        IF p_transfer_sub IS NOT NULL THEN
            SELECT i.user_id INTO v_user FROM apple_identities i
            WHERE i.transfer_sub = p_transfer_sub AND NOT (i.team_id = p_team_id AND i.sub = p_sub)
            ORDER BY i.created_at LIMIT 1;
        END IF;
        IF v_user IS NULL THEN
            v_new_user_id := gen_random_uuid();
            INSERT INTO users (id) VALUES (v_new_user_id);
            v_user := v_new_user_id;
            v_new_user := true;
        END IF;
        INSERT INTO apple_identities AS i (
            id, user_id, team_id, sub, client_id, email, unverified_email, email_verified, is_private_email,
            real_user_status, given_name, family_name, transfer_sub, last_login_at, last_verified_at, org_id)
        VALUES (
            gen_random_uuid(), v_user, p_team_id, p_sub, p_client_id, p_email,
            CASE WHEN p_user_email IS DISTINCT FROM p_email THEN p_user_email END,
            COALESCE(p_email_verified, false), COALESCE(p_is_private_email, false), p_real_user_status,
            p_given_name, p_family_name, p_transfer_sub, now(), now(), p_org_id)
        ON CONFLICT (team_id, sub) DO NOTHING
        RETURNING * INTO v_identity;
        IF FOUND THEN
            v_created := true;
            SELECT status INTO v_status FROM users WHERE id = v_identity.user_id;
        ELSE
            -- A concurrent first login of this sub won; continue as a repeat login.
            IF v_new_user THEN
                DELETE FROM users WHERE id = v_new_user_id;
                v_new_user := false;
            END IF;
            SELECT i.*, u.status AS user_status,
                   EXISTS (SELECT 1 FROM apple_tokens t WHERE t.identity_id = i.id AND t.revoked_at IS NULL) AS has_token,
                   broker_identity_unchanged_v2(i, p_client_id, g.identity_id IS NOT NULL, p_email, p_email_verified, p_is_private_email,
                       p_real_user_status, p_given_name, p_family_name, p_user_email, p_org_id, p_last_login_resolution) AS unchanged,
                   g.consent_at AS revoked_at
            INTO v_identity
            FROM apple_identities i JOIN users u ON u.id = i.user_id
            LEFT JOIN apple_grants g ON g.identity_id = i.id AND g.app_id = p_app_id AND g.consent = 'revoked'
            WHERE i.team_id = p_team_id AND i.sub = p_sub
            FOR UPDATE OF i;
            v_status := v_identity.user_status;
            v_has_token := v_identity.has_token;
            v_revoked_at := v_identity.revoked_at;
        END IF;
    END IF;

    r_user_id := v_identity.user_id;
    IF v_status = 'deleting' THEN
        r_outcome := 'deletion_pending';
        r_is_new_user := false;
        r_refresh_token_stored := false;
        RETURN NEXT;
        RETURN;
    END IF;
    -- A sign-in from before the group's revocation proves nothing after it (protocol reference
    -- §11.5, §12.1): nothing is restored or written. `iat` has whole seconds: Apple's clock
    -- cannot order a sign-in and a revocation of the same second, and the later arrival (this
    -- sign-in) wins, as a revocation arriving after a sign-in of its second does.
    IF v_revoked_at IS NOT NULL AND v_revoked_at >= p_signed_in_at + interval '1 second' THEN
        r_outcome := 'predates_revocation';
        r_is_new_user := false;
        r_refresh_token_stored := false;
        RETURN NEXT;
        RETURN;
    END IF;

    IF v_created THEN
        IF v_new_user THEN
            PERFORM broker_emit_event('user.created', v_identity.user_id, jsonb_build_object(
                'user_id', v_identity.user_id, 'client_id', p_client_id, 'is_private_email', v_identity.is_private_email,
                'real_user_status', v_identity.real_user_status));
            -- p_sub_hashes: the keyed hash under every configured key, the current one first.
            IF EXISTS (SELECT 1 FROM tombstones WHERE team_id = p_team_id AND sub_hash = ANY (p_sub_hashes)) THEN
                INSERT INTO audit_log (actor, action, subject, detail)
                VALUES ('login', 'login.new_user_after_deletion', p_sub_hashes[1],
                        jsonb_build_object('user_id', v_identity.user_id));
            END IF;
        ELSE
            PERFORM broker_emit_event('identity.linked', v_identity.user_id, jsonb_build_object(
                'user_id', v_identity.user_id, 'client_id', p_client_id, 'reason', 'team_transfer'));
        END IF;
    ELSE
        v_email_changed := (p_email IS NOT NULL AND p_email IS DISTINCT FROM v_identity.email)
            OR (p_email_verified IS NOT NULL AND p_email_verified IS DISTINCT FROM v_identity.email_verified)
            OR (p_is_private_email IS NOT NULL AND p_email IS NOT NULL
                AND p_is_private_email IS DISTINCT FROM v_identity.is_private_email);
        v_restored := EXISTS (SELECT 1 FROM apple_grants g
                              WHERE g.identity_id = v_identity.id AND g.app_id = p_app_id AND g.consent = 'revoked');
        IF v_email_changed OR v_restored OR p_refresh_token IS NOT NULL OR NOT v_identity.unchanged THEN
            UPDATE apple_identities AS i SET
                client_id = p_client_id,
                email = COALESCE(p_email, i.email),
                email_verified = COALESCE(p_email_verified, i.email_verified),
                is_private_email = CASE WHEN p_email IS NOT NULL THEN COALESCE(p_is_private_email, false)
                                        ELSE i.is_private_email END,
                real_user_status = COALESCE(p_real_user_status, i.real_user_status),
                given_name = COALESCE(p_given_name, i.given_name),
                family_name = COALESCE(p_family_name, i.family_name),
                unverified_email = CASE WHEN p_user_email IS NOT NULL AND p_user_email IS DISTINCT FROM COALESCE(p_email, i.email)
                                        THEN p_user_email ELSE i.unverified_email END,
                org_id = p_org_id,
                last_login_at = now(),
                last_verified_at = now()
            WHERE i.id = v_identity.id
            RETURNING * INTO v_identity;
            IF v_email_changed THEN
                PERFORM broker_emit_event('identity.updated', v_identity.user_id, jsonb_build_object(
                    'user_id', v_identity.user_id, 'changed', jsonb_build_array('email'),
                    'email_verified', v_identity.email_verified, 'is_private_email', v_identity.is_private_email));
            END IF;
            IF v_restored THEN
                UPDATE apple_grants SET consent = 'active', consent_at = p_signed_in_at
                WHERE identity_id = v_identity.id AND app_id = p_app_id;
                PERFORM broker_emit_event('consent.restored', v_identity.user_id, jsonb_build_object(
                    'user_id', v_identity.user_id, 'client_id', p_app_id));
            END IF;
        END IF;
    END IF;

    PERFORM broker_record_sign_in(v_identity.id, v_identity.user_id, p_app_id, p_signed_in_at);

    IF p_refresh_token IS NOT NULL THEN
        INSERT INTO apple_tokens AS t (
            id, identity_id, user_id, client_id, refresh_token, key_id, next_validation_at, authorized_at)
        VALUES (gen_random_uuid(), v_identity.id, v_identity.user_id, p_client_id, p_refresh_token, p_refresh_key_id,
                now() + interval '1 day' + p_validation_jitter, p_token_authorized_at)
        ON CONFLICT (identity_id, client_id) DO UPDATE SET
            refresh_token = EXCLUDED.refresh_token, key_id = EXCLUDED.key_id, obtained_at = now(),
            last_validated_at = NULL, next_validation_at = EXCLUDED.next_validation_at, revoked_at = NULL,
            revoked_reason = NULL, validation_failures = 0, last_validation_error = NULL,
            authorized_at = EXCLUDED.authorized_at;
        v_has_token := true;
    END IF;

    r_outcome := 'ok';
    r_is_new_user := v_new_user;
    r_email := v_identity.email;
    r_unverified_email := v_identity.unverified_email;
    r_email_verified := v_identity.email_verified;
    r_is_private_email := v_identity.is_private_email;
    r_real_user_status := v_identity.real_user_status;
    r_refresh_token_stored := v_has_token;
    RETURN NEXT;
END
$$;
