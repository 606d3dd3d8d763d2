-- A deletion request remembers the apps its user was in (deletion_requests.client_ids), so
-- the record and the user's events stay visible to those apps' limited keys after the
-- purge. The trigger is created here when missing, beside its function (see
-- audit_log_append_only.sql).
CREATE OR REPLACE FUNCTION broker_deletion_request_apps() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.client_ids := broker_user_client_ids(NEW.user_id);
    RETURN NEW;
END
$$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'deletion_requests_apps' AND tgrelid = 'deletion_requests'::regclass) THEN
        CREATE TRIGGER deletion_requests_apps BEFORE INSERT ON deletion_requests
            FOR EACH ROW EXECUTE FUNCTION broker_deletion_request_apps();
    END IF;
END $$;
