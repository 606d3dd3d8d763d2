#!/usr/bin/env bash
# make bench-webhooks: webhook delivery from the outbox to a local receiver that answers 204.
#   1. drain: COUNT events for distinct users written at once; deliveries/s until all are delivered;
#   2. latency: notifications posted through the broker at RATE/s for 10 s (open loop), each
#      writing an event; p50/p99 from the event's commit to its delivery being recorded;
#   3. pgbench on the dispatcher's own claim-and-record statements (the storage ceiling).
#   [COUNT=20000] [CONCURRENCY=16] [RATE=300] scripts/bench-webhooks.sh
. "$(dirname "$0")/bench/common.sh"
: "${COUNT:=20000}"
: "${CONCURRENCY:=16}"
: "${RATE:=300}"
: "${RECEIVER_PORT:=$(free_port)}"
"$ROOT/scripts/bootstrap.sh" test
build_release
RECEIVER_PID=
stop_everything() { [ -n "$RECEIVER_PID" ] && kill -TERM "$RECEIVER_PID" 2>/dev/null; stop_all; }
trap stop_everything EXIT

echo "== webhooks: $COUNT events, $CONCURRENCY dispatcher lanes; then $RATE notifications/s for 10 s (nproc $(nproc))"
export BROKER_DISPATCH_CONCURRENCY=$CONCURRENCY BROKER_DB_POOL_SIZE=$((CONCURRENCY + 16))
# The receiver is on loopback.
export BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS=true
start_stack
socket=$(sed -n 5p "$WORK/data/postgres/postmaster.pid")
sql() { psql -h "$socket" -U broker -d postgres -qAt -c "$1"; }
"$BIN/broker-bench" receive --listen "127.0.0.1:$RECEIVER_PORT" > "$WORK/receiver.log" 2>&1 &
RECEIVER_PID=$!
wait_http "http://127.0.0.1:$SIM_PORT/sim/stats"
subscribe() {
  curl -sf -X POST "http://127.0.0.1:$BROKER_PORT/v1/webhook-subscriptions" \
    -H "Authorization: Bearer $API_KEY" -H 'Content-Type: application/json' \
    -d "{\"url\":\"http://127.0.0.1:$RECEIVER_PORT/hook\",\"topics\":[\"*\"]}" > /dev/null
}
subscribe

# 1. Drain.
c0=$(cpu_ticks "$BROKER_PID")
start=$(date +%s.%N)
sql "SELECT count(broker_emit_event('user.created', u, jsonb_build_object('user_id', u))) FROM (SELECT gen_random_uuid() AS u FROM generate_series(1, $COUNT)) g" > /dev/null
while [ "$(sql "SELECT count(*) FROM webhook_deliveries WHERE state <> 'delivered'")" != 0 ]; do sleep 0.1; done
end=$(date +%s.%N)
c1=$(cpu_ticks "$BROKER_PID")
DRAIN_RATE=$(awk -v n="$COUNT" -v s="$start" -v e="$end" 'BEGIN{printf "%.1f", n/(e-s)}')
CPU_US=$(awk -v d=$((c1 - c0)) -v n="$COUNT" -v hz="$HZ" 'BEGIN{printf "%.0f", d/hz*1e6/n}')
printf "%-22s %9s deliveries/s  (%s in %.1f s)  broker CPU %s us/delivery\n" "drain" "$DRAIN_RATE" "$COUNT" \
  "$(awk -v s="$start" -v e="$end" 'BEGIN{print e-s}')" "$CPU_US"

# 2. Latency under a steady rate of events written by the broker itself.
psql -h "$socket" -U broker -d postgres -q -f "$ROOT/bench/seed-users.sql"
curl -sf -X POST -H 'Content-Type: application/json' \
  -d "{\"count\":$((RATE * 10)),\"users\":20000,\"client_id\":\"com.example.app\"}" \
  "http://127.0.0.1:$SIM_PORT/sim/notifications/batch" > "$WORK/notifications.txt"
mark=$(sql "SELECT coalesce(max(id), 0) FROM outbox_events")
"$BIN/broker-bench" pace --url "http://127.0.0.1:$BROKER_PORT/v1/apple/notifications" --bodies "$WORK/notifications.txt" \
  --rate "$RATE" --seconds 10 > "$WORK/pace.json" || true
for _ in $(seq 1 300); do
  [ "$(sql "SELECT count(*) FROM webhook_deliveries WHERE state <> 'delivered'")" = 0 ] && break; sleep 0.1
done
read -r P50 P99 PACED < <(sql "SELECT round((percentile_cont(0.5) WITHIN GROUP (ORDER BY ms))::numeric, 1),
    round((percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::numeric, 1), count(*)
  FROM (SELECT extract(epoch FROM d.delivered_at - e.created_at) * 1000 AS ms
        FROM webhook_deliveries d JOIN outbox_events e ON e.id = d.event_id WHERE e.id > $mark) x" | tr '|' ' ')
RSS_MB=$(awk '/VmHWM/{printf "%.1f", $2/1024}' "/proc/$BROKER_PID/status")
printf "%-22s %9s events/s offered  event->delivered p50 %s ms  p99 %s ms  (%s deliveries)  peak RSS %s MiB\n" \
  "paced" "$RATE" "$P50" "$P99" "$PACED" "$RSS_MB"

# 3. The storage ceiling: the same two statements under pgbench, against a broker without
#    the dispatch role (so only pgbench claims), on a backlog it cannot exhaust in 10 s.
stop_all
BROKER_ROLES=api start_stack
socket=$(sed -n 5p "$WORK/data/postgres/postmaster.pid")
subscribe
sql "SELECT count(broker_emit_event('user.created', u, jsonb_build_object('user_id', u))) FROM (SELECT gen_random_uuid() AS u FROM generate_series(1, 150000)) g" > /dev/null
pgbench_ref "pgbench same delivery" "$ROOT/bench/webhook-delivery.pgbench" 16 10
PG_TPS=$PGBENCH_TPS
stop_everything
RECEIVER_PID=
ratio=$(awk -v a="$DRAIN_RATE" -v b="$PG_TPS" 'BEGIN{printf "%.2f", a/b}')
cat > "$RESULTS/webhooks.json" <<JSON
{"benchmark":"webhooks","events":$COUNT,"dispatch_concurrency":$CONCURRENCY,
 "deliveries_per_second":$DRAIN_RATE,"broker_cpu_us_per_delivery":$CPU_US,
 "paced_events_per_second":$RATE,"p50_ms":$P50,"p99_ms":$P99,"paced_deliveries":$PACED,
 "broker_peak_rss_mib":$RSS_MB,"pgbench_same_delivery_tps":$PG_TPS,"ratio_to_pgbench_delivery":$ratio}
JSON
echo "== summary (also in bench-results/webhooks.json)"
echo "webhooks: $DRAIN_RATE deliveries/s draining ($ratio of pgbench on the same statements, $PG_TPS tps);" \
  "event->delivery p50 $P50 ms, p99 $P99 ms at $RATE events/s"
