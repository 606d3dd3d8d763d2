-- A webhook delivery for a subscription made by a limited key (client_ids, and app_ids: the
-- key's app groups, sql/0025) is written only for an event of its apps, counted exactly
-- (broker_event_in_apps_v2). broker_emit_event,
-- released and called by every function that writes an event, matches through
-- broker_event_in_apps, which counts grant rows (a whole app group, named by its primary), so
-- a subscription of a key limited to the primary got every member app's users' events. This
-- trigger drops those rows whoever emits them, v0.24.0 included; an unlimited subscription
-- costs one primary-key lookup. Created when missing (see audit_log_append_only.sql).
CREATE OR REPLACE FUNCTION broker_delivery_in_apps() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_client_ids text[];
    v_app_ids text[];
    v_event outbox_events%ROWTYPE;
BEGIN
    SELECT s.client_ids, s.app_ids INTO v_client_ids, v_app_ids FROM webhook_subscriptions s WHERE s.id = NEW.subscription_id;
    IF v_client_ids IS NULL THEN
        RETURN NEW;
    END IF;
    SELECT * INTO v_event FROM outbox_events e WHERE e.id = NEW.event_id;
    IF broker_event_in_apps_v2(v_event.user_id, v_event.type, v_event.payload, v_client_ids, v_app_ids) THEN
        RETURN NEW;
    END IF;
    RETURN NULL;
END
$$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'webhook_deliveries_in_apps' AND tgrelid = 'webhook_deliveries'::regclass) THEN
        CREATE TRIGGER webhook_deliveries_in_apps BEFORE INSERT ON webhook_deliveries
            FOR EACH ROW EXECUTE FUNCTION broker_delivery_in_apps();
    END IF;
END $$;
