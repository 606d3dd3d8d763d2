-- The audit log is append-only: any UPDATE or DELETE raises. The trigger is created here,
-- beside its function, because the numbered migrations run before the functions exist; both
-- happen in the migration runner's one transaction, so no one sees audit_log without it.
-- Created when missing, not replaced on every start: CREATE OR REPLACE TRIGGER would lock the
-- table against writers (and could deadlock with them) each time a replica starts. A trigger
-- whose definition changes gets a new name, like a function (docs/database.md).
CREATE OR REPLACE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only' USING ERRCODE = 'insufficient_privilege';
END
$$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'audit_log_append_only' AND tgrelid = 'audit_log'::regclass) THEN
        CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
            FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
    END IF;
END $$;
