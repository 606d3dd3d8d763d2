# Shared helpers for the benchmark scripts (sourced, not run).
# Everything runs on loopback with the release build, an embedded PostgreSQL in $WORK and
# the Apple simulator; figures go to stdout and bench-results/*.json.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
: "${WORK:=${TMPDIR:-/tmp}/appleid-broker-bench}"
: "${SIM_PORT:=18400}"
: "${BROKER_PORT:=18401}"
: "${CONNS:=32}"
: "${DUR:=15s}"
RESULTS=$ROOT/bench-results
BIN=
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
HZ=$(getconf CLK_TCK)
mkdir -p "$WORK" "$RESULTS"
chmod a+x "$WORK"

build_release() {
  echo "== building release binaries" >&2
  (cd "$ROOT" && swift build -c release --product appleid-broker >&2 && swift build -c release --product apple-sim >&2 \
    && swift build -c release --product broker-bench >&2)
  BIN=$(cd "$ROOT" && swift build -c release --show-bin-path)
}

SIM_PID=
BROKER_PID=
stop_all() {
  [ -n "$BROKER_PID" ] && kill -TERM "$BROKER_PID" 2>/dev/null && wait "$BROKER_PID" 2>/dev/null || true
  [ -n "$SIM_PID" ] && kill -TERM "$SIM_PID" 2>/dev/null && wait "$SIM_PID" 2>/dev/null || true
  BROKER_PID=; SIM_PID=
}

wait_http() {  # wait_http URL
  for _ in $(seq 1 200); do curl -sf -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "timed out waiting for $1" >&2; return 1
}

# Starts the simulator and a broker with an embedded PostgreSQL in $WORK/data (fresh).
start_stack() {
  rm -rf "$WORK/data"
  [ -f "$WORK/AuthKey.p8" ] || openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$WORK/AuthKey.p8" 2>/dev/null
  export APPLE_TEAM_ID=BENCHTEAM1 APPLE_KEY_ID=BENCHKEY01 APPLE_PRIVATE_KEY_PATH=$WORK/AuthKey.p8
  export APPLE_CLIENT_IDS=com.example.app APPLE_BASE_URL=http://127.0.0.1:$SIM_PORT
  export TOKEN_ENCRYPTION_KEY=${TOKEN_ENCRYPTION_KEY:-$(openssl rand -base64 32)}
  export BROKER_DATA_DIR=$WORK/data BROKER_LISTEN=127.0.0.1:$BROKER_PORT BROKER_LOG_LEVEL=warning BROKER_ACCESS_LOG=false
  unset DATABASE_URL
  "$BIN/apple-sim" serve --listen "127.0.0.1:$SIM_PORT" --team "$APPLE_TEAM_ID" --key-id "$APPLE_KEY_ID" \
    --key "$APPLE_PRIVATE_KEY_PATH" --client-ids "$APPLE_CLIENT_IDS" > "$WORK/sim.log" 2>&1 &
  SIM_PID=$!
  wait_http "http://127.0.0.1:$SIM_PORT/sim/stats"
  "$BIN/appleid-broker" serve > "$WORK/broker.log" 2>&1 &
  BROKER_PID=$!
  wait_http "http://127.0.0.1:$BROKER_PORT/readyz"
  API_KEY=$("$BIN/appleid-broker" api-keys create --name bench --scopes login,read,compliance,events,admin 2>/dev/null)
  export API_KEY
}

# The postmaster of the embedded cluster and its backends.
postgres_pids() {
  local master
  master=$(head -1 "$WORK/data/postgres/postmaster.pid" 2>/dev/null || true)
  [ -n "$master" ] || return 0
  echo "$master"; ps -o pid= --ppid "$master" 2>/dev/null || true
}

cpu_ticks() {  # cpu_ticks PID... : utime+stime summed
  local total=0 p
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] && total=$((total + $(awk '{print $14+$15}' "/proc/$p/stat")))
  done
  echo "$total"
}

# run_wrk NAME LUA URL : warms up 3 s, measures $DUR at $CONNS connections and sets
# RPS P50_MS P99_MS NON2XX CPU_US PG_US RSS_MB from wrk and /proc.
run_wrk() {
  local name=$1 lua=$2 url=$3 out="$WORK/$1.wrk"
  wrk -t1 -c"$CONNS" -d3s -s "$lua" "$url" > /dev/null
  local pg_pids c0 p0 c1 p1 requests
  pg_pids=$(postgres_pids)
  c0=$(cpu_ticks "$BROKER_PID"); p0=$(cpu_ticks $pg_pids)
  wrk -t1 -c"$CONNS" -d"$DUR" --latency -s "$lua" "$url" > "$out"
  c1=$(cpu_ticks "$BROKER_PID"); p1=$(cpu_ticks $pg_pids)
  requests=$(awk '/requests in/{print $1}' "$out")
  RPS=$(awk '/Requests\/sec/{print $2}' "$out")
  P50_MS=$(awk '$1=="50%"{print $2}' "$out" | sed 's/ms//;s/us/e-3/')
  P99_MS=$(awk '$1=="99%"{print $2}' "$out" | sed 's/ms//;s/us/e-3/')
  NON2XX=$(awk -F= '/non2xx=/{print $2}' "$out")
  CPU_US=$(awk -v d=$((c1 - c0)) -v n="$requests" -v hz="$HZ" 'BEGIN{printf "%.1f", d/hz*1e6/n}')
  PG_US=$(awk -v d=$((p1 - p0)) -v n="$requests" -v hz="$HZ" 'BEGIN{printf "%.1f", d/hz*1e6/n}')
  RSS_MB=$(awk '/VmHWM/{printf "%.1f", $2/1024}' "/proc/$BROKER_PID/status")
  printf "%-22s %9s req/s  p50 %7s ms  p99 %7s ms  broker CPU %7s us/req  PostgreSQL CPU %7s us/req  peak RSS %6s MiB  non-2xx %s\n" \
    "$name" "$RPS" "$P50_MS" "$P99_MS" "$CPU_US" "$PG_US" "$RSS_MB" "${NON2XX:-?}"
}

# pgbench_ref NAME FILE CLIENTS SECONDS : TPS of a pgbench script on the embedded cluster.
pgbench_ref() {
  local socket
  socket=$(sed -n 5p "$WORK/data/postgres/postmaster.pid")
  PGBENCH_TPS=$("$PG_BIN/pgbench" -h "$socket" -U broker -n -M prepared -c "$3" -j 2 -T "$4" -f "$2" postgres 2>/dev/null \
    | awk '/^tps/{printf "%.0f", $3}')
  printf "%-22s %9s tps (pgbench, %s clients, unix socket)\n" "$1" "$PGBENCH_TPS" "$3"
}
