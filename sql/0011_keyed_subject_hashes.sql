-- 0011: no unkeyed hash of a `sub` anywhere.
--
-- Tombstones, the notification inbox and the audit log named a deleted or notified user by
-- the plain SHA-256 of the sub; subs are known to the app's other systems, so that is a
-- lookup away. From now on the broker computes a keyed hash (HMAC-SHA256 under a key
-- derived from TOKEN_ENCRYPTION_KEY, `<key id>:<hex>`, SubjectHasher) and passes it in;
-- nothing in SQL hashes a sub any more.
--
-- What was stored unkeyed cannot be re-keyed (the subs are gone) and is removed: a
-- tombstone keeps its row (a deleted user id still answers `deleted`) with a random marker
-- in place of the hash, the inbox drops its hashes, and the audit log its subjects that held
-- one (the append-only trigger is set aside for this one statement, in this migration's
-- transaction).

UPDATE tombstones SET sub_hash = 'dropped:' || gen_random_uuid() WHERE sub_hash ~ '^[0-9a-f]{64}$';
UPDATE apple_notifications SET sub_hash = NULL WHERE sub_hash ~ '^[0-9a-f]{64}$';
ALTER TABLE audit_log DISABLE TRIGGER USER;
UPDATE audit_log SET subject = NULL WHERE subject ~ '^[0-9a-f]{64}$';
ALTER TABLE audit_log ENABLE TRIGGER USER;

-- The previous versions of the functions that hashed a sub (a database migrated by a release
-- before sql/functions/ has them); the live ones are in sql/functions/.
DROP FUNCTION IF EXISTS broker_login(text, text, text, text, text, boolean, boolean, text, text, text, text, text, bytea, text, interval, interval);
DROP FUNCTION IF EXISTS broker_apply_notification(text, text, text, text, timestamptz, text, text[]);
DROP FUNCTION IF EXISTS broker_purge_user(uuid);
