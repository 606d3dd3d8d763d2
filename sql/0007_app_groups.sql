-- 0007: consent and mail forwarding belong to an app group, not to the team identity.
--
-- Apple scopes a user's authorization to a primary App ID (an app with the App IDs and
-- Services IDs grouped under it); notifications name it in `aud` (protocol reference
-- §10.2). One team identity can hold several groups' grants: a consent-revoked for app B
-- must leave app A's grant and refresh token alone. A group is named by its primary App ID
-- (`app_id`); the broker's configuration (APPLE_APP_GROUPS) says which client ids belong to
-- it and passes both to these functions. No row means the default: consent active,
-- forwarding enabled, so the common case costs one primary-key probe.
CREATE TABLE apple_grants (
    identity_id          uuid NOT NULL REFERENCES apple_identities (id) ON DELETE CASCADE,
    user_id              uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    app_id               text NOT NULL,                   -- the group's primary App ID
    consent              text NOT NULL DEFAULT 'active' CHECK (consent IN ('active', 'revoked')),
    consent_at           timestamptz,                     -- event_time of the change applied last
    email_forwarding     text NOT NULL DEFAULT 'enabled' CHECK (email_forwarding IN ('enabled', 'disabled')),
    email_forwarding_at  timestamptz,
    PRIMARY KEY (identity_id, app_id)
);
CREATE INDEX apple_grants_user_id ON apple_grants (user_id);

-- What the identity-wide columns said, kept for the app the identity used last. The broker
-- renames a member client id to its group's primary App ID at start (AppGroupsAlignment).
INSERT INTO apple_grants (identity_id, user_id, app_id, consent, consent_at, email_forwarding, email_forwarding_at)
SELECT id, user_id, client_id, consent, consent_at, email_forwarding, email_forwarding_at
FROM apple_identities
WHERE consent <> 'active' OR email_forwarding <> 'enabled' OR consent_at IS NOT NULL OR email_forwarding_at IS NOT NULL;

-- The e-mail in Apple's unsigned first-authorization `user` field is kept apart: `email`
-- comes only from a verified token (a backend linking accounts by e-mail could otherwise be
-- taken over with {"user":{"email":"victim@…"}}); the unsigned one is kept at the first
-- authorization only, as unverified_email, never marked verified.
ALTER TABLE apple_identities ADD COLUMN unverified_email text;

DROP FUNCTION broker_apply_notification(text, text, text, text, timestamptz);
DROP FUNCTION broker_revoke_consent(uuid, timestamptz, text);
DROP FUNCTION broker_login(text, text, text, text, boolean, boolean, text, text, text, text, text, bytea, text, interval, interval);
DROP FUNCTION broker_identity_unchanged(apple_identities, text, text, boolean, boolean, text, text, text, text, interval);
ALTER TABLE apple_identities
    DROP COLUMN consent, DROP COLUMN consent_at, DROP COLUMN email_forwarding, DROP COLUMN email_forwarding_at;

-- Whether a login with these verified facts would change nothing on this identity but
-- last_login_at, and that one is recent enough to leave alone (the read-only fast path in
-- LoginStore and broker_login agree through it). The group's consent must be active: the
-- caller joins its apple_grants row and passes whether it is revoked, because a sub-select
-- here would stop PostgreSQL from inlining the function into the login's query (it would
-- then be planned again on every login).
CREATE FUNCTION broker_identity_unchanged(
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

-- The login upsert of 0002, with consent re-activated for the login's group only
-- (p_app_id) and consent.restored naming that group, and the unsigned `user` e-mail kept
-- apart as unverified_email (first authorization only).
CREATE FUNCTION broker_login(
    p_team_id text, p_sub text, p_client_id text, p_app_id text,
    p_email text, p_email_verified boolean, p_is_private_email boolean, p_real_user_status text,
    p_given_name text, p_family_name text, p_user_email text, p_transfer_sub text,
    p_refresh_token bytea, p_refresh_key_id text,
    p_last_login_resolution interval, p_validation_jitter interval
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
    v_sub_hash text;
BEGIN
    SELECT i.*, u.status AS user_status,
           EXISTS (SELECT 1 FROM apple_tokens t WHERE t.identity_id = i.id AND t.revoked_at IS NULL) AS has_token,
           broker_identity_unchanged(i, p_client_id, g.identity_id IS NOT NULL, p_email, p_email_verified, p_is_private_email,
               p_real_user_status, p_given_name, p_family_name, p_user_email, p_last_login_resolution) AS unchanged
    INTO v_identity
    FROM apple_identities i JOIN users u ON u.id = i.user_id
    LEFT JOIN apple_grants g ON g.identity_id = i.id AND g.app_id = p_app_id AND g.consent = 'revoked'
    WHERE i.team_id = p_team_id AND i.sub = p_sub;
    IF FOUND THEN
        v_status := v_identity.user_status;
        v_has_token := v_identity.has_token;
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
            real_user_status, given_name, family_name, transfer_sub, last_login_at, last_verified_at)
        VALUES (
            gen_random_uuid(), v_user, p_team_id, p_sub, p_client_id, p_email,
            CASE WHEN p_user_email IS DISTINCT FROM p_email THEN p_user_email END,
            COALESCE(p_email_verified, false), COALESCE(p_is_private_email, false), p_real_user_status,
            p_given_name, p_family_name, p_transfer_sub, now(), now())
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
                   broker_identity_unchanged(i, p_client_id, g.identity_id IS NOT NULL, p_email, p_email_verified, p_is_private_email,
                       p_real_user_status, p_given_name, p_family_name, p_user_email, p_last_login_resolution) AS unchanged
            INTO v_identity
            FROM apple_identities i JOIN users u ON u.id = i.user_id
            LEFT JOIN apple_grants g ON g.identity_id = i.id AND g.app_id = p_app_id AND g.consent = 'revoked'
            WHERE i.team_id = p_team_id AND i.sub = p_sub;
            v_status := v_identity.user_status;
            v_has_token := v_identity.has_token;
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

    IF v_created THEN
        IF v_new_user THEN
            PERFORM broker_emit_event('user.created', v_identity.user_id, jsonb_build_object(
                'user_id', v_identity.user_id, 'client_id', p_client_id, 'is_private_email', v_identity.is_private_email,
                'real_user_status', v_identity.real_user_status));
            v_sub_hash := encode(sha256(convert_to(p_sub, 'UTF8')), 'hex');
            IF EXISTS (SELECT 1 FROM tombstones WHERE team_id = p_team_id AND sub_hash = v_sub_hash) THEN
                INSERT INTO audit_log (actor, action, subject, detail)
                VALUES ('login', 'login.new_user_after_deletion', v_sub_hash,
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
                given_name = COALESCE(i.given_name, p_given_name),
                family_name = COALESCE(i.family_name, p_family_name),
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
                UPDATE apple_grants SET consent = 'active', consent_at = now()
                WHERE identity_id = v_identity.id AND app_id = p_app_id;
                PERFORM broker_emit_event('consent.restored', v_identity.user_id, jsonb_build_object(
                    'user_id', v_identity.user_id, 'client_id', p_app_id));
            END IF;
        END IF;
    END IF;

    IF p_refresh_token IS NOT NULL THEN
        INSERT INTO apple_tokens AS t (id, identity_id, user_id, client_id, refresh_token, key_id, next_validation_at)
        VALUES (gen_random_uuid(), v_identity.id, v_identity.user_id, p_client_id, p_refresh_token, p_refresh_key_id,
                now() + interval '1 day' + p_validation_jitter)
        ON CONFLICT (identity_id, client_id) DO UPDATE SET
            refresh_token = EXCLUDED.refresh_token, key_id = EXCLUDED.key_id, obtained_at = now(),
            last_validated_at = NULL, next_validation_at = EXCLUDED.next_validation_at, revoked_at = NULL;
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


-- Marks one group's consent revoked for an identity (a consent-revoked notification for
-- that group, or a refresh Apple answers as a revoked grant): deletes the identity's
-- refresh tokens of the group's client ids, which are dead at Apple, leaves the other
-- groups' alone, and emits consent.revoked naming the group. A change issued at or before
-- the group's last applied change is ignored. Returns true when consent was active.
CREATE FUNCTION broker_revoke_consent(
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

-- Applies one verified notification exactly once (0003), now to the group its `aud`
-- names: email-disabled/-enabled and consent-revoked change that group's grant only;
-- account-delete stays user-wide (Apple deleted the Apple Account).
CREATE FUNCTION broker_apply_notification(
    p_jti text, p_type text, p_team_id text, p_sub text, p_event_time timestamptz, p_app_id text, p_client_ids text[]
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_identity apple_identities%ROWTYPE;
    v_grant apple_grants%ROWTYPE;
    v_has_grant boolean;
    v_sub_hash text := encode(sha256(convert_to(p_sub, 'UTF8')), 'hex');
    v_outcome text;
    v_forwarding text;
BEGIN
    IF EXISTS (SELECT 1 FROM apple_notifications WHERE jti = p_jti) THEN
        RETURN 'duplicate';
    END IF;

    SELECT * INTO v_identity FROM apple_identities WHERE team_id = p_team_id AND sub = p_sub FOR UPDATE;
    IF NOT FOUND THEN
        v_outcome := 'unknown_subject';
    ELSE
        SELECT * INTO v_grant FROM apple_grants WHERE identity_id = v_identity.id AND app_id = p_app_id;
        v_has_grant := FOUND;
        IF p_type IN ('email-disabled', 'email-enabled') THEN
            v_forwarding := CASE p_type WHEN 'email-disabled' THEN 'disabled' ELSE 'enabled' END;
            IF v_has_grant AND v_grant.email_forwarding_at IS NOT NULL AND v_grant.email_forwarding_at >= p_event_time THEN
                v_outcome := 'stale';
            ELSE
                INSERT INTO apple_grants (identity_id, user_id, app_id, email_forwarding, email_forwarding_at)
                VALUES (v_identity.id, v_identity.user_id, p_app_id, v_forwarding, p_event_time)
                ON CONFLICT (identity_id, app_id) DO UPDATE
                SET email_forwarding = EXCLUDED.email_forwarding, email_forwarding_at = EXCLUDED.email_forwarding_at;
                IF COALESCE(v_grant.email_forwarding, 'enabled') IS DISTINCT FROM v_forwarding THEN
                    PERFORM broker_emit_event('email.forwarding_' || v_forwarding, v_identity.user_id, jsonb_build_object(
                        'user_id', v_identity.user_id, 'client_id', p_app_id,
                        'is_private_email', v_identity.is_private_email, 'event_time', p_event_time));
                END IF;
                v_outcome := 'applied';
            END IF;
        ELSIF p_type = 'consent-revoked' THEN
            IF v_has_grant AND v_grant.consent_at IS NOT NULL AND v_grant.consent_at >= p_event_time THEN
                v_outcome := 'stale';
            ELSE
                PERFORM broker_revoke_consent(v_identity.id, p_app_id, p_client_ids, p_event_time, 'apple');
                v_outcome := 'applied';
            END IF;
        ELSIF p_type IN ('account-delete', 'account-deleted') THEN
            PERFORM broker_request_deletion(v_identity.user_id, 'apple', 'apple account deleted', 'apple');
            v_outcome := 'applied';
        ELSE
            v_outcome := 'unknown_type';
        END IF;
    END IF;

    INSERT INTO apple_notifications (jti, event_type, sub_hash, event_time, outcome)
    VALUES (p_jti, p_type, v_sub_hash, p_event_time, v_outcome);
    INSERT INTO audit_log (actor, action, subject, detail)
    VALUES ('apple', 'notification.' || p_type, v_sub_hash,
            jsonb_build_object('jti', p_jti, 'outcome', v_outcome, 'client_id', p_app_id));
    RETURN v_outcome;
END
$$;

-- The refresh sweep backs off per token when Apple's answer is no verdict on it
-- (invalid_client, 5xx, timeouts): consecutive failures, reset by a verdict.
ALTER TABLE apple_tokens ADD COLUMN validation_failures integer NOT NULL DEFAULT 0;
