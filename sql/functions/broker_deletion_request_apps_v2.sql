-- A deletion request remembers the apps its user was in, exactly (broker_user_apps), so the
-- record and the user's events stay visible to those apps' limited keys after the purge. Its
-- trigger is a new one beside v1's (created when missing, see audit_log_append_only.sql):
-- BEFORE triggers run in name order, so it runs after deletion_requests_apps and its value
-- stands. The old trigger goes with the release after this one.
CREATE OR REPLACE FUNCTION broker_deletion_request_apps_v2() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.client_ids := broker_user_apps(NEW.user_id);
    RETURN NEW;
END
$$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'deletion_requests_apps_v2' AND tgrelid = 'deletion_requests'::regclass) THEN
        CREATE TRIGGER deletion_requests_apps_v2 BEFORE INSERT ON deletion_requests
            FOR EACH ROW EXECUTE FUNCTION broker_deletion_request_apps_v2();
    END IF;
END $$;
