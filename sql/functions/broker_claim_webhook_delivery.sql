-- The dispatcher's claim as one function, so its plan is pinned.
--
-- PL/pgSQL, not SQL: a SQL function's body is planned on every call, and lanes claim
-- after every event (a login's user.created); PL/pgSQL keeps the plan for the session.
--
-- Why a function: a backlog appears in seconds (a burst of deletions, a receiver back from
-- an outage) while the table's statistics still say it is nearly empty. With those stale
-- statistics the planner sorts every due row to find the first one (50 ms at 20,000 rows,
-- and 16 lanes claiming made it 700 ms); `enable_sort = off` for this function alone makes
-- it walk webhook_deliveries_due in (next_attempt_at, id) order and stop at the first
-- claimable row, whatever the statistics say.
--
-- A row is claimable when it is due, its subscription is active (a pause parks deliveries
-- at 'infinity'; the check covers an event committed while the pause was), and it heads its
-- (subscription, user) queue. The claim is a lease: next_attempt_at moves `lease` ahead, so
-- a dispatcher killed mid-delivery loses nothing.
CREATE OR REPLACE FUNCTION broker_claim_webhook_delivery(lease interval)
RETURNS TABLE (
    delivery_id bigint, attempts integer, delivery_created_at timestamptz, event_id bigint, event_type text,
    payload text, event_created_at timestamptz, subscription_id uuid, url text, secret bytea, key_id text)
LANGUAGE plpgsql VOLATILE
SET enable_sort = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH next AS (
        SELECT d.id FROM webhook_deliveries d
        WHERE d.state = 'pending' AND d.next_attempt_at <= now()
          AND (SELECT s.status FROM webhook_subscriptions s WHERE s.id = d.subscription_id) = 'active'
          AND NOT EXISTS (
              SELECT 1 FROM webhook_deliveries e
              WHERE e.subscription_id = d.subscription_id AND e.ordering_key = d.ordering_key
                AND e.state = 'pending' AND e.id < d.id)
        ORDER BY d.next_attempt_at, d.id LIMIT 1
        FOR UPDATE OF d SKIP LOCKED)
    UPDATE webhook_deliveries d SET attempts = d.attempts + 1, next_attempt_at = now() + lease
    FROM next, outbox_events e, webhook_subscriptions s
    WHERE d.id = next.id AND e.id = d.event_id AND s.id = d.subscription_id
    RETURNING d.id, d.attempts, d.created_at, e.id, e.type, e.payload::text, e.created_at, s.id, s.url, s.secret, s.key_id;
END
$$;
