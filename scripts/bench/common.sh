# Shared helpers for the benchmark scripts (sourced, not run).
# Everything runs on loopback with the release build, an embedded PostgreSQL in $WORK and
# the Apple simulator; figures go to stdout and bench-results/*.json.
set -euo pipefail
# set -e stops a benchmark at the first failing command; say which one.
trap 'echo "$(basename "$0"): stopped: \"$BASH_COMMAND\" failed (line $LINENO); logs in $WORK" >&2' ERR
: "${WORK:=${TMPDIR:-/tmp}/appleid-broker-bench}"
: "${CONNS:=32}"
: "${DUR:=15s}"
# shellcheck source=../lib/stack.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/stack.sh"
# One benchmark at a time per work directory: a second one would share its cluster, and its
# figures would be taken while another heavy job runs. `make bench` runs the others under its
# own lock (they inherit it, and must not take it again through a second open of the file).
if [ "${BENCH_LOCK_HELD:-}" != "$WORK" ]; then
  exec 9> "$WORK/.lock"
  flock -n 9 || { echo "$(basename "$0"): another benchmark is using $WORK; wait for it or set WORK" >&2; exit 1; }
  export BENCH_LOCK_HELD=$WORK
fi
RESULTS=$ROOT/bench-results
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
HZ=$(getconf CLK_TCK)
mkdir -p "$RESULTS"
# Benchmarks measure throughput, so the per-key and per-address rate limits are off, and
# logs are quiet so that writing them does not cost CPU the figures would count.
export BROKER_RATE_LIMIT_PER_KEY=0 BROKER_RATE_LIMIT_NOTIFICATIONS_PER_IP=0
export BROKER_LOG_LEVEL=warning BROKER_ACCESS_LOG=false
export APPLE_TEAM_ID=BENCHTEAM1 APPLE_KEY_ID=BENCHKEY01

build_release() {
  echo "== building release binaries" >&2
  (cd "$ROOT" && swift build -c release --product appleid-broker >&2 && swift build -c release --product apple-sim >&2 \
    && swift build -c release --product broker-bench >&2)
  BIN=$(cd "$ROOT" && swift build -c release --show-bin-path)
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
