#!/usr/bin/env bash
# make bench-login: POST /v1/apple/login under wrk with pre-minted RS256 tokens for many
# distinct users (first and repeat logins, no code exchange), against the embedded
# PostgreSQL and the Apple simulator; then pgbench on the same upsert (storage reference)
# and the interleaved A/B against the Go peer in ../shared/peers (same run, same machine).
#   [CONNS=32] [DUR=15s] [TOKENS=20000] [USERS=100000] [AB_ROUNDS=3] [AB=0 to skip] scripts/bench-login.sh
. "$(dirname "$0")/bench/common.sh"
: "${TOKENS:=20000}"
: "${USERS:=100000}"
: "${AB_ROUNDS:=3}"
: "${AB:=1}"
"$ROOT/scripts/bootstrap.sh" test
build_release
trap stop_all EXIT

echo "== login: $CONNS connections, $DUR, $TOKENS tokens over $USERS users (nproc $(nproc))"
start_stack
curl -sf -X POST -H 'Content-Type: application/json' \
  -d "{\"count\":$TOKENS,\"users\":$USERS,\"client_id\":\"com.example.app\"}" \
  "http://127.0.0.1:$SIM_PORT/sim/tokens/batch" > "$WORK/tokens.txt"
export TOKENS_FILE=$WORK/tokens.txt
TOKENS="$WORK/tokens.txt" run_wrk login "$ROOT/bench/login.lua" "http://127.0.0.1:$BROKER_PORT" || true
LOGIN_RPS=$RPS LOGIN_P50=$P50_MS LOGIN_P99=$P99_MS LOGIN_CPU=$CPU_US LOGIN_PG=$PG_US LOGIN_RSS=$RSS_MB LOGIN_NON2XX=$NON2XX
pgbench_ref "pgbench same upsert" "$ROOT/bench/login-upsert.pgbench" 16 10
PG_TPS=$PGBENCH_TPS
stop_all

AB_RATIO=null; AB_CPU=null
if [ "$AB" = 1 ] && [ -d "$ROOT/../shared/peers" ]; then
  peers=$ROOT/../shared/peers
  echo "== A/B against the Go peer (go-oidc + lib/pq), $AB_ROUNDS interleaved rounds of $DUR"
  "$peers/setup.sh" > "$WORK/peers-setup.log" 2>&1 || { echo "peer setup failed: see $WORK/peers-setup.log"; exit 1; }
  # shellcheck disable=SC1091
  . "$peers/env.sh"
  "$peers/pg_peer.sh" start > /dev/null
  psql -h "$PGHOST" -p "$PGPORT" -U postgres -d postgres -qc "DROP DATABASE IF EXISTS appleid_broker_ab" \
    -c "CREATE DATABASE appleid_broker_ab" > /dev/null 2>&1
  # The peer's fixtures: its JWKS server stands in for Apple's /auth/keys, its tokens are
  # minted up to an hour before use (so the maximum token age is relaxed for this run).
  export DATABASE_URL="host=$PGHOST port=$PGPORT user=postgres dbname=appleid_broker_ab"
  export APPLE_CLIENT_IDS=$AUDIENCE APPLE_BASE_URL=${JWKS_URL%/auth/keys} APPLE_TOKEN_MAX_AGE_SECONDS=7200
  AB_PORT=$(free_port)
  export BROKER_LISTEN=127.0.0.1:$AB_PORT
  AB_KEY=$("$BIN/appleid-broker" api-keys create --name ab --scopes login 2>/dev/null)
  SVC_CMD="$BIN/appleid-broker serve" SVC_PORT=$AB_PORT SVC_PATH=/v1/apple/login API_KEY=$AB_KEY \
    "$peers/bench_ab.sh" "$AB_ROUNDS" "$DUR" "$CONNS" | tee "$WORK/ab.txt" | grep -E "^round|ratio|WARNING" || true
  AB_RATIO=$(awk '/median throughput ratio/{print $7}' "$WORK/ab.txt")
  AB_CPU=$(awk '/median throughput ratio/{print $NF}' "$WORK/ab.txt")
  "$peers/pg_peer.sh" stop > /dev/null || true
fi

cat > "$RESULTS/login.json" <<JSON
{"benchmark":"login","connections":$CONNS,"duration":"$DUR","tokens":$TOKENS,"users":$USERS,
 "requests_per_second":$LOGIN_RPS,"p50_ms":$LOGIN_P50,"p99_ms":$LOGIN_P99,"non_2xx":${LOGIN_NON2XX:-0},
 "broker_cpu_us_per_request":$LOGIN_CPU,"postgres_cpu_us_per_request":$LOGIN_PG,"broker_peak_rss_mib":$LOGIN_RSS,
 "pgbench_same_upsert_tps":${PG_TPS:-null},"ab_throughput_ratio_vs_go_peer":${AB_RATIO:-null},
 "ab_cpu_efficiency_ratio_vs_go_peer":${AB_CPU:-null}}
JSON
echo "== summary (also in bench-results/login.json)"
echo "login $LOGIN_RPS req/s, p99 $LOGIN_P99 ms, $LOGIN_CPU us CPU/req, peak RSS $LOGIN_RSS MiB;" \
  "pgbench reference $PG_TPS tps; A/B vs Go peer: throughput x$AB_RATIO, CPU efficiency x$AB_CPU"
echo "goals: >= 1.3x the Go peer's throughput, CPU/req <= 0.6x its (efficiency ratio >= 1.67), p99 <= 15 ms, RSS <= 100 MiB"
