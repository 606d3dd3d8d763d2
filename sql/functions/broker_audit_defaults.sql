-- Every audit row names its target and outcome (issue 38, item 5; the columns are sql/0025's).
-- Most of this release's writers name them (BrokerCore's AuditLog); the rows of the others get
-- them here from what they hold: the released SQL functions' and the previous release's during a
-- rolling upgrade (deletion.requested, deletion.retried, deletion.purged, the deletion job's
-- steps, notification.*, token.invalidated, api_key.*, webhook_subscription.*), which record
-- acts that happened or a deletion step with its outcome in `detail`, and those that put a
-- `target` and an `outcome` word in `detail` (the OpenID Provider's: `oidc_client.created` with
-- target `<client id>` becomes `oidc_client:<client id>`; `refused…` is refused; `failed`,
-- `not_found` and `error` are failed; any other word is succeeded).
-- A BEFORE INSERT trigger, created when missing (see audit_log_append_only.sql).
CREATE OR REPLACE FUNCTION broker_audit_defaults() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.target IS NULL THEN
        NEW.target := CASE
            WHEN jsonb_typeof(NEW.detail -> 'target') = 'string'
                THEN split_part(NEW.action, '.', 1) || ':' || left(NEW.detail ->> 'target', 200)
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
            WHEN NEW.action NOT LIKE 'deletion.%' AND jsonb_typeof(NEW.detail -> 'outcome') = 'string' THEN CASE
                WHEN NEW.detail ->> 'outcome' IN ('succeeded', 'refused', 'failed') THEN NEW.detail ->> 'outcome'
                WHEN NEW.detail ->> 'outcome' LIKE 'refused%' THEN 'refused'
                WHEN NEW.detail ->> 'outcome' IN ('not_found', 'error') THEN 'failed'
                ELSE 'succeeded' END
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
