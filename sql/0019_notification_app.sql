-- 0019: which app an Apple notification was for (issue 30: the console's last notification per
-- app). Expand only: a nullable column the previous release neither reads nor writes; its
-- rows stay NULL ("not attributed") and age out with the inbox's retention.
-- client_id: the notification's `aud` (the client id it matched; Apple's notifications name
-- the group's primary App ID, protocol reference §10.2), set by NotificationStore after
-- broker_apply_notification in the same transaction.
ALTER TABLE apple_notifications ADD COLUMN client_id text;
CREATE INDEX apple_notifications_client_received ON apple_notifications (client_id, received_at)
    WHERE client_id IS NOT NULL;
