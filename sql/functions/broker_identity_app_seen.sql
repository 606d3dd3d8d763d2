-- Records every client id an Apple identity signs in with (apple_identity_apps, sql/0025):
-- apple_identities.client_id keeps only the last one, and a sign-in with an identity token
-- only stores no token, so without this a user of app B who signed in to app A afterwards
-- looked like app A's alone to a key limited to A (issue 38, item 8). A trigger, so the
-- previous release's sign-ins are recorded too; created when missing (see
-- audit_log_append_only.sql). An unchanged client id costs nothing (WHEN).
CREATE OR REPLACE FUNCTION broker_identity_app_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO apple_identity_apps (identity_id, client_id) VALUES (NEW.id, NEW.client_id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'apple_identities_app_seen' AND tgrelid = 'apple_identities'::regclass) THEN
        CREATE TRIGGER apple_identities_app_seen AFTER INSERT ON apple_identities
            FOR EACH ROW EXECUTE FUNCTION broker_identity_app_seen();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'apple_identities_app_changed' AND tgrelid = 'apple_identities'::regclass) THEN
        CREATE TRIGGER apple_identities_app_changed AFTER UPDATE OF client_id ON apple_identities
            FOR EACH ROW WHEN (OLD.client_id IS DISTINCT FROM NEW.client_id) EXECUTE FUNCTION broker_identity_app_seen();
    END IF;
END $$;
