-- The audit log is append-only: any UPDATE or DELETE raises. The trigger is created here,
-- beside its function (CREATE OR REPLACE TRIGGER), because the numbered migrations run
-- before the functions exist; both happen in the migration runner's one transaction, so
-- no one sees audit_log without it.
CREATE OR REPLACE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only' USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE OR REPLACE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
