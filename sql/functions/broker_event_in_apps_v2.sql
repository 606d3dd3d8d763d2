-- Whether an event belongs to the apps of a limited key: these client ids, exactly, and the
-- app groups (primary App IDs) they are in. An event that names an app is that app's only
-- (issue 38, item 8: app B's consent.revoked is none of app A's business, whoever the user
-- is): a grant's event (consent.*, email.forwarding_*, token.invalidated) names its group's
-- primary, which is the key's own grant when one of its client ids is in the group; a
-- sign-in's event (user.created, identity.linked) names the exact client id. An event that
-- names no app (user.deletion_requested, user.deleted, identity.updated) is about the user:
-- it belongs to the apps the user is in (broker_user_apps, not the grants of whole app
-- groups) or was in when its deletion was requested.
CREATE OR REPLACE FUNCTION broker_event_in_apps_v2(
    p_user_id uuid, p_type text, p_payload jsonb, p_client_ids text[], p_app_ids text[]
) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_payload ? 'client_id' AND (p_type LIKE 'consent.%' OR p_type LIKE 'email.forwarding_%' OR p_type = 'token.invalidated')
            THEN (p_payload ->> 'client_id') = ANY (p_client_ids || coalesce(p_app_ids, '{}'))
        WHEN p_payload ? 'client_id'
            THEN (p_payload ->> 'client_id') = ANY (p_client_ids)
        ELSE broker_user_apps(p_user_id) && p_client_ids
            OR EXISTS (SELECT 1 FROM deletion_requests d WHERE d.user_id = p_user_id AND d.client_ids && p_client_ids)
    END
$$;
