-- Whether an event (its user and payload) belongs to one of these client ids, exactly
-- (broker_user_apps: identities and tokens, not the grants of whole app groups).
CREATE OR REPLACE FUNCTION broker_event_in_apps_v2(p_user_id uuid, p_payload jsonb, p_client_ids text[]) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT (p_payload ->> 'client_id') = ANY (p_client_ids)
        OR broker_user_apps(p_user_id) && p_client_ids
        OR EXISTS (SELECT 1 FROM deletion_requests d WHERE d.user_id = p_user_id AND d.client_ids && p_client_ids)
$$;
