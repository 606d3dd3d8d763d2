-- The client ids a user is in: an identity's last client id, a client id holding a token
-- for it, an app group Apple told us about (a grant).
CREATE OR REPLACE FUNCTION broker_user_client_ids(p_user_id uuid) RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT c), '{}') FROM (
        SELECT i.client_id AS c FROM apple_identities i WHERE i.user_id = p_user_id
        UNION SELECT t.client_id FROM apple_tokens t WHERE t.user_id = p_user_id
        UNION SELECT g.app_id FROM apple_grants g WHERE g.user_id = p_user_id
    ) AS clients
$$;
