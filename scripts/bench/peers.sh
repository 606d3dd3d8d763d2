# The Go peer's fixtures for the login benchmarks (sourced by bench-login.sh and
# bench-settings.sh): its folder (../shared/peers: go-oidc + lib/pq, its JWK Set server,
# tokens, PostgreSQL cluster and scripts), set up in a work directory of this run
# ($WORK/peers) on ports picked free, so two runs on one machine never share a cluster or a
# port. Every server of a login benchmark (this build, the previous release, the Go peer, two
# settings) uses that one cluster: same settings. ab_prime readies one side of an A/B.

# The peers' folder: PEERS_DIR, else ../shared/peers beside the checkout, else beside the
# main checkout of a git worktree (/work/wt/x → /work/main/../shared).
find_peers() {
  local common
  if [ -n "${PEERS_DIR:-}" ] && [ -f "$PEERS_DIR/bench_ab.sh" ]; then echo "$PEERS_DIR"; return 0; fi
  if [ -f "$ROOT/../shared/peers/bench_ab.sh" ]; then (cd "$ROOT/../shared/peers" && pwd); return 0; fi
  common=$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
  if [ -n "$common" ] && [ -f "$common/../../shared/peers/bench_ab.sh" ]; then
    (cd "$common/../../shared/peers" && pwd); return 0
  fi
  return 1
}

# peers_start: setup.sh (idempotent), then the cluster with pg_stat_statements loaded but not
# counting (pg_stat_statements.track = none unless a session asks: the profile does), on free
# ports. Sets PEERS; exports what env.sh exports (PGHOST, PGPORT, JWKS_URL, AUDIENCE, …).
peers_start() {
  PEERS=$(find_peers) || { echo "bench-login: no ../shared/peers (set PEERS_DIR)" >&2; return 1; }
  export PEERS_DIR=$PEERS PEERS_WORK=$WORK/peers
  export JWKS_PORT=${JWKS_PORT:-$(free_port)} GOPEER_PORT=${GOPEER_PORT:-$(free_port)} PG_PORT=${PG_PORT:-$(free_port)}
  mkdir -p "$PEERS_WORK"
  "$PEERS/setup.sh" > "$WORK/peers-setup.log" 2>&1 || { echo "peer setup failed: see $WORK/peers-setup.log" >&2; return 1; }
  # shellcheck disable=SC1091
  . "$PEERS/env.sh"
  # The cluster must not inherit the benchmark's lock (common.sh's fd 9): it would hold it after a failed run.
  "$PEERS/pg_peer.sh" start 9>&- > /dev/null
  PEERS_STARTED=1
  if [ "$(peers_psql postgres -tAc "SHOW shared_preload_libraries")" != pg_stat_statements ]; then
    peers_psql postgres -qc "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
    "$PEERS/pg_peer.sh" stop > /dev/null
    "$PEERS/pg_peer.sh" start 9>&- > /dev/null
  fi
  if [ "$(peers_psql postgres -tAc "SHOW pg_stat_statements.track")" != none ]; then
    peers_psql postgres -qc "ALTER SYSTEM SET pg_stat_statements.track = 'none'" -c "SELECT pg_reload_conf()" > /dev/null
  fi
}

peers_stop() {
  [ -n "${PEERS_STARTED:-}" ] || return 0
  [ -n "${PEERS_JWKS_PID:-}" ] && stop_pid "$PEERS_JWKS_PID"
  PEERS_JWKS_PID=
  "$PEERS/pg_peer.sh" stop > /dev/null || true
  PEERS_STARTED=
}

peers_psql() {  # peers_psql DATABASE psql-args...
  local database=$1; shift
  PGOPTIONS="-c client_min_messages=warning" "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -h "$PGHOST" -p "$PGPORT" -U postgres -d "$database" "$@"
}

# peers_fresh_database NAME: an empty database for one server of the benchmark.
peers_fresh_database() {
  peers_psql postgres -qc "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1" > /dev/null
}

# The peer's JWK Set server (bench_ab.sh starts its own and stops it after its rounds).
peers_jwks_start() {
  [ -n "${PEERS_JWKS_PID:-}" ] && return 0
  start_jwks "$KEYS" "$JWKS_PORT" bench_jwks
  PEERS_JWKS_PID=$JWKS_PID
}

peers_jwks_stop() {
  [ -n "${PEERS_JWKS_PID:-}" ] && stop_pid "$PEERS_JWKS_PID"
  PEERS_JWKS_PID=
}

wait_port() {  # wait_port PORT : until something listens on 127.0.0.1:PORT (30 s at most)
  local i
  for i in $(seq 1 300); do port_busy "$1" && return 0; sleep 0.1; done
  echo "nothing listens on port $1" >&2
  return 1
}

# A broker's database on the cluster.
database_url() { echo "host=$PGHOST port=$PGPORT user=postgres dbname=$1"; }

# ab_prime NAME BIN DATABASE PORT [NAME=VALUE...] : for one side of an interleaved A/B, prints
# a new API key with the login scope, after starting BIN's broker on DATABASE and PORT with the
# settings given and signing every token's user in once (so the rounds measure repeat logins),
# then stopping it. Its log is $WORK/NAME-prime.log.
ab_prime() {
  local name=$1 bin=$2 database=$3 port=$4 key pid
  shift 4
  key=$(DATABASE_URL="$(database_url "$database")" BROKER_LISTEN=127.0.0.1:$port \
    "$bin/appleid-broker" api-keys create --name ab --scopes login 2> /dev/null)
  # The URL is quoted: it has spaces, and env(1) would take its words for more settings.
  env "$@" DATABASE_URL="$(database_url "$database")" BROKER_LISTEN=127.0.0.1:$port \
    "$bin/appleid-broker" serve > "$WORK/$name-prime.log" 2>&1 &
  pid=$!
  wait_http "http://127.0.0.1:$port/readyz" "$pid" || { kill -TERM "$pid" 2> /dev/null; return 1; }
  API_KEY=$key BODY_FMT=both MAX_DUR=120s run_wrk_once "($name: every user once)" "$TOKENS_RS256" \
    "http://127.0.0.1:$port" > /dev/null
  kill -TERM "$pid" && wait "$pid" || true
  echo "$key"
}
