-- 0014: `user.deleted` at most once per user, whatever the path (issue 29 item 10).
--
-- Before this release a dead-lettered deletion could be followed by a second request for
-- the same user (the open-request index ignores 'failed'); when both were later purged, two
-- `user.deleted` went out. This table holds one row per user whose `user.deleted` was
-- written, and a trigger on outbox_events (sql/functions/broker_user_deleted_once.sql)
-- refuses a second one, for this release's functions and the previous release's alike. It
-- is never pruned (event retention prunes outbox_events): a user id is a random UUID, not
-- personal data.
CREATE TABLE user_deleted_events (
    user_id     uuid PRIMARY KEY,
    event_id    bigint,                                   -- no foreign key: events are pruned; NULL when backfilled from a request
    emitted_at  timestamptz NOT NULL DEFAULT now()
);

-- History: the events still in the outbox, then every completed request (a purge marks its
-- request done and writes user.deleted in one transaction).
INSERT INTO user_deleted_events (user_id, event_id, emitted_at)
SELECT DISTINCT ON (user_id) user_id, id, created_at FROM outbox_events
WHERE type = 'user.deleted' AND user_id IS NOT NULL ORDER BY user_id, id;
INSERT INTO user_deleted_events (user_id, emitted_at)
SELECT user_id, min(coalesce(completed_at, updated_at)) FROM deletion_requests WHERE state = 'done' GROUP BY user_id
ON CONFLICT (user_id) DO NOTHING;
