#!/usr/bin/env bash
# make bench-deletion: deletions/s with the Apple simulator adding LATENCY_MS to every
# revoke. Each user has one refresh token; all deletions are requested at once and the
# time until the last is done is measured. With concurrency C and latency L the job
# cannot beat C / L deletions per second; the figure should approach it.
#   [USERS=2000] [LATENCY_MS=100] [CONCURRENCY=32] scripts/bench-deletion.sh
. "$(dirname "$0")/bench/common.sh"
: "${USERS:=2000}"
: "${LATENCY_MS:=100}"
: "${CONCURRENCY:=32}"
"$ROOT/scripts/bootstrap.sh" test
build_release
trap stop_all EXIT

echo "== deletions: $USERS users with a refresh token, revoke latency $LATENCY_MS ms, concurrency $CONCURRENCY"
export BROKER_DELETION_CONCURRENCY=$CONCURRENCY BROKER_DB_POOL_SIZE=$((CONCURRENCY + 8))
start_stack
socket=$(sed -n 5p "$WORK/data/postgres/postmaster.pid")
DATABASE_URL="host=$socket user=broker dbname=postgres" "$BIN/broker-bench" seed-tokens --users "$USERS" > /dev/null
curl -sf -X PUT -H 'Content-Type: application/json' -d "{\"latency_ms\":$LATENCY_MS,\"endpoints\":[\"revoke\"]}" \
  "http://127.0.0.1:$SIM_PORT/sim/faults" > /dev/null
c0=$(cpu_ticks "$BROKER_PID")
start=$(date +%s.%N)
psql -h "$socket" -U broker -d postgres -qAt \
  -c "SELECT count(*) FROM users u, broker_request_deletion(u.id, 'api', 'benchmark', 'bench') d" > /dev/null
curl -sf -X POST "http://127.0.0.1:$BROKER_PORT/readyz" > /dev/null 2>&1 || true
while [ "$(psql -h "$socket" -U broker -d postgres -qAt -c "SELECT count(*) FROM deletion_requests WHERE state <> 'done'")" != 0 ]; do
  sleep 0.2
done
end=$(date +%s.%N)
c1=$(cpu_ticks "$BROKER_PID")
read -r P50 P99 < <(psql -h "$socket" -U broker -d postgres -qAt -c "SELECT
    round((percentile_cont(0.5) WITHIN GROUP (ORDER BY ms))::numeric, 1), round((percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::numeric, 1)
  FROM (SELECT extract(epoch FROM completed_at - created_at) * 1000 AS ms FROM deletion_requests) x" | tr '|' ' ')
revoked=$(curl -sf "http://127.0.0.1:$SIM_PORT/sim/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["revoke"])')
rate=$(awk -v n="$USERS" -v s="$start" -v e="$end" 'BEGIN{printf "%.1f", n/(e-s)}')
bound=$(awk -v c="$CONCURRENCY" -v l="$LATENCY_MS" 'BEGIN{printf "%.1f", c/(l/1000)}')
share=$(awk -v r="$rate" -v b="$bound" 'BEGIN{printf "%.2f", r/b}')
cpu=$(awk -v d=$((c1 - c0)) -v n="$USERS" -v hz="$HZ" 'BEGIN{printf "%.0f", d/hz*1e6/n}')
rss=$(awk '/VmHWM/{printf "%.1f", $2/1024}' "/proc/$BROKER_PID/status")
stop_all
printf "deletions              %9s /s  (%s users in %.1f s, %s revoke calls)  request->done p50 %s ms  p99 %s ms  broker CPU %s us/deletion  peak RSS %s MiB\n" \
  "$rate" "$USERS" "$(awk -v s="$start" -v e="$end" 'BEGIN{print e-s}')" "$revoked" "$P50" "$P99" "$cpu" "$rss"
echo "concurrency $CONCURRENCY / revoke latency $LATENCY_MS ms = at most $bound /s: reached $share of it"
cat > "$RESULTS/deletion.json" <<JSON
{"benchmark":"deletion","users":$USERS,"revoke_latency_ms":$LATENCY_MS,"concurrency":$CONCURRENCY,
 "deletions_per_second":$rate,"p50_ms":$P50,"p99_ms":$P99,"upper_bound_per_second":$bound,"share_of_bound":$share,
 "broker_cpu_us_per_deletion":$cpu,"broker_peak_rss_mib":$rss,"revoke_calls":$revoked}
JSON
