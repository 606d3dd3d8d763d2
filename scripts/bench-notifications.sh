#!/usr/bin/env bash
# make bench-notifications: Apple's server-to-server notifications ingested end to end
# (verify, dedupe, apply, outbox) under wrk, each with a fresh jti, for 20,000 existing
# users, each posted once (a second post is a duplicate: another, cheaper request); then
# pgbench on the same database work and on the login upsert (the login benchmark's storage
# reference).   [CONNS=32] [DUR=15s: the longest the bodies may take] [COUNT=120000]
# scripts/bench-notifications.sh
. "$(dirname "$0")/bench/common.sh"
: "${COUNT:=120000}"
WARM=4000
"$ROOT/scripts/bootstrap.sh" test
build_release
trap stop_all EXIT

echo "== notifications: $CONNS connections, $DUR, $COUNT pre-signed notifications over 20000 users (nproc $(nproc))"
start_stack
socket=$(sed -n 5p "$WORK/data/postgres/postmaster.pid")
psql -h "$socket" -U broker -d postgres -q -f "$ROOT/bench/seed-users.sql"
curl -sf -X POST -H 'Content-Type: application/json' \
  -d "{\"count\":$((COUNT + WARM)),\"users\":20000,\"client_id\":\"com.example.app\"}" \
  "http://127.0.0.1:$SIM_PORT/sim/notifications/batch" > "$WORK/notifications-all.txt"
head -n "$WARM" "$WORK/notifications-all.txt" > "$WORK/notifications-warm.txt"
tail -n +"$((WARM + 1))" "$WORK/notifications-all.txt" > "$WORK/notifications.txt"
export URLPATH=/v1/apple/notifications BODY_FMT=raw
MAX_DUR=$DUR run_wrk_once "(notifications warm-up)" "$WORK/notifications-warm.txt" "http://127.0.0.1:$BROKER_PORT" > /dev/null || true
MAX_DUR=$DUR run_wrk_once notifications "$WORK/notifications.txt" "http://127.0.0.1:$BROKER_PORT" || true
unset URLPATH BODY_FMT
N_RPS=$RPS N_P50=$P50_MS N_P99=$P99_MS N_CPU=$CPU_US N_PG=$PG_US N_RSS=$RSS_MB N_NON2XX=$NON2XX
pgbench_ref "pgbench same apply" "$ROOT/bench/notification-apply.pgbench" 16 10
APPLY_TPS=$PGBENCH_TPS
pgbench_ref "pgbench login upsert" "$ROOT/bench/login-upsert.pgbench" 16 10
LOGIN_TPS=$PGBENCH_TPS
stop_all

ratio=$(awk -v a="$N_RPS" -v b="$APPLY_TPS" 'BEGIN{printf "%.2f", a/b}')
ratio_login=$(awk -v a="$N_RPS" -v b="$LOGIN_TPS" 'BEGIN{printf "%.2f", a/b}')
cat > "$RESULTS/notifications.json" <<JSON
{"benchmark":"notifications","connections":$CONNS,"duration":"$DUR","notifications":$COUNT,
 "notifications_per_second":$N_RPS,"p50_ms":$N_P50,"p99_ms":$N_P99,"non_2xx":${N_NON2XX:-0},
 "broker_cpu_us_per_request":$N_CPU,"postgres_cpu_us_per_request":$N_PG,"broker_peak_rss_mib":$N_RSS,
 "pgbench_same_apply_tps":$APPLY_TPS,"ratio_to_pgbench_apply":$ratio,
 "pgbench_login_upsert_tps":$LOGIN_TPS,"ratio_to_pgbench_login_upsert":$ratio_login}
JSON
echo "== summary (also in bench-results/notifications.json)"
echo "notifications $N_RPS/s, p99 $N_P99 ms; ratio to pgbench of the same apply $ratio (goal >= 0.6); to the login upsert reference $ratio_login"
