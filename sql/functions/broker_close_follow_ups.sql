-- Closes TN3194 follow-ups (deletion_app_groups, sql/0021) when Apple says the user stopped
-- using the app group (a consent-revoked whose aud is one of the group's client ids and whose
-- event is newer than the group's last sign-in the deletion knew of: an older one is stale,
-- protocol reference §12.1; a second's grace, as event times may come in whole seconds) or
-- deleted the Apple Account (account-delete): in the notification's own transaction, the
-- moment it is stored, and for good. The inbox row names its app only after
-- NotificationStore's UPDATE (sql/0019), hence INSERT OR UPDATE OF client_id; a row the
-- previous release writes names none, and a consent-revoked without an app closes nothing.
-- The trigger is created here when missing (see audit_log_append_only.sql).
CREATE OR REPLACE FUNCTION broker_close_follow_ups() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.sub_hash IS NULL THEN
        RETURN NEW;
    END IF;
    IF NEW.event_type IN ('account-delete', 'account-deleted') THEN
        UPDATE deletion_app_groups SET follow_up_closed_at = NEW.received_at, follow_up_closed_by = 'account-delete'
        WHERE sub_hash = NEW.sub_hash AND revocation = 'manual_required' AND follow_up_closed_at IS NULL;
    ELSIF NEW.event_type = 'consent-revoked' AND NEW.client_id IS NOT NULL THEN
        UPDATE deletion_app_groups SET follow_up_closed_at = NEW.received_at, follow_up_closed_by = 'consent-revoked'
        WHERE sub_hash = NEW.sub_hash AND revocation = 'manual_required' AND follow_up_closed_at IS NULL
          AND NEW.client_id = ANY (client_ids)
          AND (authorized_at IS NULL OR coalesce(NEW.event_time, NEW.received_at) + interval '1 second' > authorized_at);
    END IF;
    RETURN NEW;
END
$$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'apple_notifications_close_follow_ups' AND tgrelid = 'apple_notifications'::regclass) THEN
        CREATE TRIGGER apple_notifications_close_follow_ups AFTER INSERT OR UPDATE OF client_id ON apple_notifications
            FOR EACH ROW EXECUTE FUNCTION broker_close_follow_ups();
    END IF;
END $$;
