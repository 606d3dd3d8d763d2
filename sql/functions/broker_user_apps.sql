-- The client ids a user is in, exactly: every client id one of its identities signed in with
-- (apple_identity_apps, sql/0025: an identity token alone leaves no token, and the identity's
-- own client_id is only the last one), and a client id holding a token for it. Not grants: a
-- grant row names a whole app group by its primary App ID and says nothing about which
-- member the user uses (broker_user_client_ids counted them, so a key limited to a group's
-- primary reached every member's users; issue 29, item 3).
CREATE OR REPLACE FUNCTION broker_user_apps(p_user_id uuid) RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT c), '{}') FROM (
        SELECT i.client_id AS c FROM apple_identities i WHERE i.user_id = p_user_id
        UNION SELECT a.client_id FROM apple_identity_apps a JOIN apple_identities i ON i.id = a.identity_id
            WHERE i.user_id = p_user_id
        UNION SELECT t.client_id FROM apple_tokens t WHERE t.user_id = p_user_id
    ) AS clients
$$;
