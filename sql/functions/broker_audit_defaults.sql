-- Every audit row names its target and outcome (issue 38, item 5; the columns are sql/0025's).
-- This release's writers name them (BrokerCore's AuditLog); the rows the released SQL
-- functions write, and the previous release during a rolling upgrade (deletion.requested,
-- deletion.retried, deletion.purged, the deletion job's steps, notification.*,
-- token.invalidated, api_key.*, webhook_subscription.*), get them here from what they hold.
-- Those writers record acts that happened, or a deletion step with its outcome in `detail`.
-- A BEFORE INSERT trigger, created when missing (see audit_log_append_only.sql).
CREATE OR REPLACE FUNCTION broker_audit_defaults() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.target IS NULL THEN
        NEW.target := CASE
            WHEN NEW.deletion_id IS NOT NULL THEN 'deletion:' || NEW.deletion_id
            WHEN NEW.detail ? 'key_id' THEN 'api_key:' || (NEW.detail ->> 'key_id')
            WHEN NEW.detail ? 'subscription_id' THEN 'webhook_subscription:' || (NEW.detail ->> 'subscription_id')
            WHEN NEW.action LIKE 'notification.%' AND NEW.detail ? 'jti' THEN 'apple_notification:' || (NEW.detail ->> 'jti')
            WHEN NEW.action = 'token.invalidated' AND NEW.subject IS NOT NULL THEN 'user:' || NEW.subject
        END;
    END IF;
    IF NEW.outcome IS NULL THEN
        NEW.outcome := CASE
            WHEN NEW.action = 'deletion.failed' THEN 'failed'
            WHEN NEW.action LIKE 'deletion.%' AND NEW.detail ? 'outcome' AND (NEW.detail ->> 'outcome') NOT IN
                ('revoked', 'already_invalid', 'exchanged', 'done', 'skipped', 'manual_revocation_required') THEN 'failed'
            ELSE 'succeeded'
        END;
    END IF;
    RETURN NEW;
END
$$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'audit_log_defaults' AND tgrelid = 'audit_log'::regclass) THEN
        CREATE TRIGGER audit_log_defaults BEFORE INSERT ON audit_log
            FOR EACH ROW EXECUTE FUNCTION broker_audit_defaults();
    END IF;
END $$;
