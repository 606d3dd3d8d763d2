-- Writes one outbox event and, in the same transaction, one delivery row per webhook
-- subscription whose topics match; a limited subscription (client_ids) only gets its apps'
-- events, an unlimited one (client_ids NULL) costs no lookup. No NOTIFY: PostgreSQL
-- serialises every notifying commit on one lock, which would cap login throughput; the
-- dispatcher polls briefly and is woken in-process by the writer. The rows written here are
-- bounded by BROKER_WEBHOOK_MAX_SUBSCRIPTIONS (WebhookSubscriptionStore.create refuses more
-- subscriptions), which is what keeps a login's transaction from growing with them.
CREATE OR REPLACE FUNCTION broker_emit_event(p_type text, p_user_id uuid, p_payload jsonb)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO outbox_events (type, user_id, payload)
    VALUES (p_type, p_user_id, p_payload)
    RETURNING id INTO v_id;
    INSERT INTO webhook_deliveries (event_id, subscription_id, ordering_key, next_attempt_at)
    SELECT v_id, s.id, p_user_id, CASE WHEN s.status = 'active' THEN now() ELSE 'infinity' END
    FROM webhook_subscriptions s
    WHERE (s.topics ? p_type OR s.topics ? '*')
      AND (s.client_ids IS NULL OR broker_event_in_apps(p_user_id, p_payload, s.client_ids));
    RETURN v_id;
END
$$;
