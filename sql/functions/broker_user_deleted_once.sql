-- `user.deleted` is written once per user (sql/0014): a second one raises, so the purge
-- that tried it rolls back (and is retried, then dead-lettered) instead of telling app
-- backends twice that the user is gone. A trigger, not a check in the purge, so that every
-- writer is held to it, the previous release's purge included. The trigger is created here
-- when missing, beside its function (see audit_log_append_only.sql).
CREATE OR REPLACE FUNCTION broker_user_deleted_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO user_deleted_events (user_id, event_id) VALUES (NEW.user_id, NEW.id)
    ON CONFLICT (user_id) DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user.deleted was already written for user %', NEW.user_id USING ERRCODE = '23505';
    END IF;
    RETURN NEW;
END
$$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'outbox_events_user_deleted_once' AND tgrelid = 'outbox_events'::regclass) THEN
        CREATE TRIGGER outbox_events_user_deleted_once BEFORE INSERT ON outbox_events
            FOR EACH ROW WHEN (NEW.type = 'user.deleted') EXECUTE FUNCTION broker_user_deleted_once();
    END IF;
END $$;
