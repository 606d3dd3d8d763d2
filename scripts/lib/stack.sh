# Starts and stops a throwaway stack on loopback: the Apple simulator and a broker with an
# embedded PostgreSQL in $WORK/data. Sourced by the benchmark, conformance and tour scripts.
# The caller sets BIN (the directory holding appleid-broker and apple-sim).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
: "${WORK:=${TMPDIR:-/tmp}/appleid-broker-stack}"
# shellcheck source=ports.sh
source "$ROOT/scripts/lib/ports.sh"
# shellcheck source=wait.sh
source "$ROOT/scripts/lib/wait.sh"
: "${SIM_PORT:=$(free_port)}"
: "${BROKER_PORT:=$(free_port)}"
: "${API_SCOPES:=login,read,compliance,events,admin}"
BIN=${BIN:-}
mkdir -p "$WORK"
# The embedded cluster runs as 'postgres' when we are root; it must be able to reach $WORK.
chmod a+x "$WORK"

SIM_PID=
BROKER_PID=
stop_all() {
  local had_broker=$BROKER_PID
  [ -n "$BROKER_PID" ] && kill -TERM "$BROKER_PID" 2>/dev/null && wait "$BROKER_PID" 2>/dev/null || true
  [ -n "$SIM_PID" ] && kill -TERM "$SIM_PID" 2>/dev/null && wait "$SIM_PID" 2>/dev/null || true
  BROKER_PID=; SIM_PID=
  # The broker stops its embedded PostgreSQL when nothing else uses it: none may be left behind.
  local master
  master=$(head -1 "$WORK/data/postgres/postmaster.pid" 2>/dev/null || true)
  if [ -n "$had_broker" ] && [ -n "$master" ] && kill -0 "$master" 2>/dev/null; then
    echo "$(basename "$0"): the embedded PostgreSQL (pid $master) outlived the broker; see $WORK/broker.log" >&2
    kill -TERM "$master" 2>/dev/null || true
    return 1
  fi
}

wait_http() {  # wait_http URL [PID]: waits up to 180 s (a first start runs initdb and the migrations),
  # and gives up at once when PID, the server being waited for, has exited. STACK_CA: the CA of a broker serving HTTPS.
  local deadline=$((SECONDS + 180))
  until curl -sf -m 5 ${STACK_CA:+--cacert "$STACK_CA"} -o /dev/null "$1"; do
    if [ -n "${2:-}" ] && ! kill -0 "$2" 2>/dev/null; then
      echo "waiting for $1: the server exited (its log is in $WORK)" >&2; return 1
    fi
    [ "$SECONDS" -lt "$deadline" ] || { echo "timed out waiting for $1" >&2; return 1; }
    sleep 0.1
  done
}

# Starts the simulator and a broker on a fresh embedded PostgreSQL, then creates an API key
# with $API_SCOPES and exports it as API_KEY. Extra broker settings come from the caller's
# environment (exported before the call); SIM_RETURN_URLS (`id=url,url;id2=url`) registers
# Return URLs at the simulator for web sign-in and the OpenID Provider.
# STACK_DATABASE_URL runs the broker on that database instead of the embedded cluster.
start_stack() {
  rm -rf "$WORK/data"
  [ -f "$WORK/AuthKey.p8" ] || openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$WORK/AuthKey.p8" 2>/dev/null
  export APPLE_TEAM_ID=${APPLE_TEAM_ID:-STACKTEAM1} APPLE_KEY_ID=${APPLE_KEY_ID:-STACKKEY01}
  export APPLE_PRIVATE_KEY_PATH=$WORK/AuthKey.p8
  export APPLE_CLIENT_IDS=${APPLE_CLIENT_IDS:-com.example.app} APPLE_BASE_URL=http://127.0.0.1:$SIM_PORT
  export TOKEN_ENCRYPTION_KEY=${TOKEN_ENCRYPTION_KEY:-$(openssl rand -base64 32)}
  export BROKER_DATA_DIR=$WORK/data BROKER_LISTEN=127.0.0.1:$BROKER_PORT
  if [ -n "${STACK_DATABASE_URL:-}" ]; then export DATABASE_URL=$STACK_DATABASE_URL; else unset DATABASE_URL; fi
  "$BIN/apple-sim" serve --listen "127.0.0.1:$SIM_PORT" --team "$APPLE_TEAM_ID" --key-id "$APPLE_KEY_ID" \
    --key "$APPLE_PRIVATE_KEY_PATH" --client-ids "$APPLE_CLIENT_IDS" ${SIM_RETURN_URLS:+--return-urls "$SIM_RETURN_URLS"} \
    > "$WORK/sim.log" 2>&1 &
  SIM_PID=$!
  wait_http "http://127.0.0.1:$SIM_PORT/sim/stats" "$SIM_PID"
  "$BIN/appleid-broker" serve > "$WORK/broker.log" 2>&1 &
  BROKER_PID=$!
  # A broker with BROKER_TLS_* speaks HTTPS only.
  wait_http "$([ -n "${BROKER_TLS_CERT_PATH:-}" ] && echo https || echo http)://127.0.0.1:$BROKER_PORT/readyz" "$BROKER_PID" ||
    { tail -5 "$WORK/broker.log" >&2; return 1; }
  API_KEY=$("$BIN/appleid-broker" api-keys create --name stack --scopes "$API_SCOPES" 2>/dev/null)
  export API_KEY
}

# The postmaster of the embedded cluster and its backends.
postgres_pids() {
  local master
  master=$(head -1 "$WORK/data/postgres/postmaster.pid" 2>/dev/null || true)
  [ -n "$master" ] || return 0
  echo "$master"; ps -o pid= --ppid "$master" 2>/dev/null || true
}
