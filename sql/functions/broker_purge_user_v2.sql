-- Purges a deletion request's user as broker_purge_user does (called, not copied: while both
-- releases run, v1 is the previous release's), and adds to its user.deleted what the deletion
-- came to at Apple for each app group (sql/0021): `apple_revocation_by_app`, primary App ID →
-- revoked | already_invalid | manual_required | transferred, so app backends learn which apps
-- still need the user to stop using Sign in with Apple in Settings (TN3194). The event is
-- completed in the purge's own transaction, before anyone can read it.
CREATE OR REPLACE FUNCTION broker_purge_user_v2(p_deletion_id uuid, p_team_ids text[], p_sub_hashes text[])
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_by_app jsonb;
BEGIN
    SELECT coalesce(jsonb_object_agg(app_id, revocation), '{}'::jsonb) INTO v_by_app
    FROM deletion_app_groups WHERE deletion_id = p_deletion_id;
    IF NOT broker_purge_user(p_deletion_id, p_team_ids, p_sub_hashes) THEN
        RETURN false;
    END IF;
    UPDATE outbox_events o SET payload = o.payload || jsonb_build_object('apple_revocation_by_app', v_by_app)
    FROM deletion_requests d JOIN user_deleted_events u ON u.user_id = d.user_id
    WHERE d.id = p_deletion_id AND o.id = u.event_id AND o.type = 'user.deleted';
    RETURN true;
END
$$;
