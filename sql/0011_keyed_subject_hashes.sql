-- 0011: no unkeyed hash of a `sub` anywhere.
--
-- Tombstones, the notification inbox and the audit log named a deleted or notified user by
-- the plain SHA-256 of the sub; subs are known to the app's other systems, so that is a
-- lookup away. From now on the broker computes a keyed hash (HMAC-SHA256 under a key
-- derived from TOKEN_ENCRYPTION_KEY, `<key id>:<hex>`, SubjectHasher) and passes it in;
-- nothing in SQL hashes a sub any more.
--
-- What was stored unkeyed cannot be re-keyed (the subs are gone) and is removed: a
-- tombstone keeps its row (a deleted user id still answers `deleted`) with a random marker
-- in place of the hash, the inbox drops its hashes, and the audit log its subjects that held
-- one (the append-only trigger is set aside for this one statement, in this migration's
-- transaction).

UPDATE tombstones SET sub_hash = 'dropped:' || gen_random_uuid() WHERE sub_hash ~ '^[0-9a-f]{64}$';
UPDATE apple_notifications SET sub_hash = NULL WHERE sub_hash ~ '^[0-9a-f]{64}$';
ALTER TABLE audit_log DISABLE TRIGGER USER;
UPDATE audit_log SET subject = NULL WHERE subject ~ '^[0-9a-f]{64}$';
ALTER TABLE audit_log ENABLE TRIGGER USER;

DROP FUNCTION broker_login(text, text, text, text, text, boolean, boolean, text, text, text, text, text, bytea, text, interval, interval);
DROP FUNCTION broker_apply_notification(text, text, text, text, timestamptz, text, text[]);
DROP FUNCTION broker_purge_user(uuid);

-- The login upsert of 0007, with the tombstone check on keyed hashes.
CREATE FUNCTION broker_login(
    p_team_id text, p_sub text, p_client_id text, p_app_id text,
    p_email text, p_email_verified boolean, p_is_private_email boolean, p_real_user_status text,
    p_given_name text, p_family_name text, p_user_email text, p_transfer_sub text,
    p_refresh_token bytea, p_refresh_key_id text,
    p_last_login_resolution interval, p_validation_jitter interval, p_sub_hashes text[]
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

-- The notification of 0007, storing the keyed hash it is given.
CREATE FUNCTION broker_apply_notification(
    p_jti text, p_type text, p_team_id text, p_sub text, p_event_time timestamptz, p_app_id text, p_client_ids text[], p_sub_hash text
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_identity apple_identities%ROWTYPE;
    v_grant apple_grants%ROWTYPE;
    v_has_grant boolean;
    v_sub_hash text := p_sub_hash;
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

-- The purge of 0008, writing the keyed hashes it is given.
CREATE FUNCTION broker_purge_user(p_deletion_id uuid, p_team_ids text[], p_sub_hashes text[]) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_request deletion_requests%ROWTYPE;
    v_identities integer;
BEGIN
    SELECT * INTO v_request FROM deletion_requests WHERE id = p_deletion_id FOR UPDATE;
    IF NOT FOUND OR v_request.state <> 'purging' THEN
        RETURN false;
    END IF;
    -- One keyed hash per identity, computed by the job from the identities it read: if one
    -- was added since, the purge is refused (and retried) rather than leave it untombstoned.
    SELECT count(*) INTO v_identities FROM apple_identities i WHERE i.user_id = v_request.user_id;
    IF v_identities <> coalesce(cardinality(p_sub_hashes), 0) THEN
        RAISE EXCEPTION 'the user''s identities changed during the deletion' USING ERRCODE = '40001';
    END IF;
    INSERT INTO tombstones (deletion_id, team_id, sub_hash, user_id, reason, requested_by)
    SELECT p_deletion_id, h.team_id, h.sub_hash, v_request.user_id, v_request.reason, v_request.requested_by
    FROM unnest(p_team_ids, p_sub_hashes) AS h (team_id, sub_hash)
    ON CONFLICT DO NOTHING;
    DELETE FROM users WHERE id = v_request.user_id;
    UPDATE deletion_requests SET state = 'done', completed_at = now(), updated_at = now(), last_error = NULL,
        authorization_code = NULL, code_key_id = NULL, code_client_id = NULL, code_redirect_uri = NULL
    WHERE id = p_deletion_id;
    INSERT INTO deletion_steps (deletion_id, step, outcome, detail)
    VALUES (p_deletion_id, 'purge', 'done', v_identities || ' identities tombstoned');
    INSERT INTO audit_log (actor, action, subject, deletion_id, detail)
    VALUES ('deletion-job', 'deletion.purged', v_request.user_id::text, p_deletion_id,
            jsonb_build_object('identities', v_identities, 'source', v_request.source,
                               'apple_revocation', v_request.apple_revocation));
    PERFORM broker_emit_event('user.deleted', v_request.user_id, jsonb_build_object(
        'user_id', v_request.user_id, 'deletion_id', p_deletion_id, 'source', v_request.source,
        'apple_revocation', v_request.apple_revocation));
    RETURN true;
END
$$;
