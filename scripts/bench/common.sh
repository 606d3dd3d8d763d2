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

# host_cpu: "steal total" jiffies of the whole machine (/proc/stat). Steal is time the
# hypervisor gave this VM's CPUs to someone else; when it is high, every process here runs
# slower and its CPU per request grows, so the A/B phases print it beside their figures.
host_cpu() {
  awk '/^cpu /{t=0; for (i = 2; i <= 9; i++) t += $i; print $9, t; exit}' /proc/stat
}

# steal_percent "STEAL0 TOTAL0" "STEAL1 TOTAL1": the share of CPU time stolen in between.
steal_percent() {
  awk -v a="$1" -v b="$2" 'BEGIN{split(a, x, " "); split(b, y, " "); t = y[2] - x[2];
    printf "%.1f", (t > 0 ? 100 * (y[1] - x[1]) / t : 0)}'
}

# tree_pids PID: the process and its descendants.
tree_pids() {
  local p=$1 c
  echo "$p"
  for c in $(pgrep -P "$p" || true); do tree_pids "$c"; done
}

# The PostgreSQL processes whose CPU a figure counts: the tree of PG_MASTER_PID (a cluster
# the benchmark started itself) when set, else the embedded cluster's.
measured_postgres_pids() {
  if [ -n "${PG_MASTER_PID:-}" ]; then tree_pids "$PG_MASTER_PID"; else postgres_pids; fi
}

# run_wrk NAME LUA URL : warms up 3 s, measures $DUR at $CONNS connections and sets
# RPS P50_MS P99_MS NON2XX CPU_US PG_US RSS_MB REQUESTS from wrk and /proc.
run_wrk() {
  local name=$1 lua=$2 url=$3 out="$WORK/$1.wrk"
  wrk -t1 -c"$CONNS" -d3s -s "$lua" "$url" > /dev/null
  local c0 p0 c1 p1
  c0=$(cpu_ticks "$BROKER_PID"); p0=$(cpu_ticks $(measured_postgres_pids))
  wrk -t1 -c"$CONNS" -d"$DUR" --latency -s "$lua" "$url" > "$out"
  c1=$(cpu_ticks "$BROKER_PID"); p1=$(cpu_ticks $(measured_postgres_pids))
  wrk_figures "$name" "$out" $((c1 - c0)) $((p1 - p0))
}

# run_wrk_once NAME TOKENS_FILE URL : every line of the file once (bench/login-once.lua: first
# logins, code exchanges; BODY_FMT=raw: notification bodies), no warm-up;
# wrk is stopped when the last line is answered, or after MAX_DUR (default $DUR); EXHAUSTED=1
# when every line was used before that. Sets the figures run_wrk sets.
run_wrk_once() {
  local name=$1 tokens=$2 url=$3 out="$WORK/$1.wrk" done_file="$WORK/$1.done" pid c0 p0 c1 p1
  rm -f "$done_file"
  c0=$(cpu_ticks "$BROKER_PID"); p0=$(cpu_ticks $(measured_postgres_pids))
  TOKENS=$tokens DONE_FILE=$done_file wrk -t1 -c"$CONNS" -d"${MAX_DUR:-$DUR}" --latency -s "$ROOT/bench/login-once.lua" \
    "$url" > "$out" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && [ ! -e "$done_file" ]; do sleep 0.1; done
  kill -INT "$pid" 2>/dev/null || true
  wait "$pid" || true
  c1=$(cpu_ticks "$BROKER_PID"); p1=$(cpu_ticks $(measured_postgres_pids))
  EXHAUSTED=$([ -e "$done_file" ] && echo 1 || echo 0)
  wrk_figures "$name" "$out" $((c1 - c0)) $((p1 - p0))
}

# wrk_ms WRK_OUTPUT 99% : a latency percentile of wrk's output in milliseconds.
wrk_ms() {
  awk -v p="$2" '$1==p{v=$2; f=1; if (v ~ /us$/) f=0.001; else if (v ~ /ms$/) f=1; else if (v ~ /s$/) f=1000
    gsub(/[a-z]+$/, "", v); printf "%.3f", v*f}' "$1"
}

# wrk_figures NAME WRK_OUTPUT BROKER_TICKS POSTGRES_TICKS : the figures of one wrk run.
wrk_figures() {
  local name=$1 out=$2 requests
  requests=$(awk '/requests in/{print $1}' "$out")
  REQUESTS=$requests
  RPS=$(awk '/Requests\/sec/{print $2}' "$out")
  P50_MS=$(wrk_ms "$out" 50%)
  P99_MS=$(wrk_ms "$out" 99%)
  NON2XX=$(awk -F= '/non2xx=/{print $2}' "$out")
  CPU_US=$(awk -v d="$3" -v n="$requests" -v hz="$HZ" 'BEGIN{printf "%.1f", d/hz*1e6/n}')
  PG_US=$(awk -v d="$4" -v n="$requests" -v hz="$HZ" 'BEGIN{printf "%.1f", d/hz*1e6/n}')
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
