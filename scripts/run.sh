#!/usr/bin/env bash
# Runs appleid-broker on this machine: installs missing Debian packages, builds (release),
# and starts the service with an embedded PostgreSQL. Without Apple settings in the
# environment it runs a local demo: it creates demo credentials in .appleid-broker/demo
# and points the broker at the Apple simulator on 127.0.0.1:8090 (APPLE_SIM_LISTEN moves it;
# BROKER_LISTEN moves the broker from 127.0.0.1:8080).
# Stop with Ctrl-C (SIGINT) or SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh

echo "== building (release)" >&2
swift build -c release --product appleid-broker
swift build -c release --product apple-sim
bin="$(swift build -c release --show-bin-path)"

# initdb/postgres refuse root; as root they run as the 'postgres' account, which must be
# able to reach the data directory. A home directory under /root is private: use /var/lib.
if [ "$(id -u)" = 0 ] && [ -z "${BROKER_DATA_DIR:-}" ] && ! runuser -u postgres -- test -x "$PWD"; then
  export BROKER_DATA_DIR=/var/lib/appleid-broker
  echo "== running as root in a private directory: data goes to $BROKER_DATA_DIR" >&2
fi
data="${BROKER_DATA_DIR:-$PWD/.appleid-broker}"
mkdir -p "$data"

if [ -z "${APPLE_CLIENT_IDS:-}" ]; then
  demo="$data/demo"
  mkdir -p "$demo"
  chmod 700 "$demo"
  [ -f "$demo/AuthKey_DEMOKEY001.p8" ] || openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$demo/AuthKey_DEMOKEY001.p8" 2>/dev/null
  [ -f "$demo/token-encryption-key" ] || openssl rand -base64 32 > "$demo/token-encryption-key"
  export APPLE_TEAM_ID=DEMOTEAM01 APPLE_KEY_ID=DEMOKEY001
  export APPLE_PRIVATE_KEY_PATH="$demo/AuthKey_DEMOKEY001.p8"
  export APPLE_CLIENT_IDS="com.example.app,com.example.web"
  # The app and its web Services ID are one app group at Apple (required with several client ids).
  export APPLE_APP_GROUPS="com.example.app=com.example.web"
  # The simulator's address: APPLE_SIM_LISTEN moves it (scripts/tour.sh does when 8090 is taken).
  sim_listen="${APPLE_SIM_LISTEN:-127.0.0.1:8090}"
  export APPLE_BASE_URL="${APPLE_BASE_URL:-http://$sim_listen}"
  export TOKEN_ENCRYPTION_KEY="$(cat "$demo/token-encryption-key")"
  # Web sign-in through the broker for the Services ID, ending at an app's page on :3000.
  export BROKER_PUBLIC_URL="${BROKER_PUBLIC_URL:-http://${BROKER_LISTEN:-127.0.0.1:8080}}"
  export APPLE_WEB_RETURN_URLS="${APPLE_WEB_RETURN_URLS:-com.example.web=http://localhost:3000/apple/done}"
  # The tour's webhook receiver is on this machine; outside the demo receivers must be public.
  export BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS="${BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS:-true}"
  echo "== demo mode: Apple settings from $demo; the Apple simulator plays appleid.apple.com" >&2
  "$bin/apple-sim" serve --listen "$sim_listen" --team "$APPLE_TEAM_ID" --key-id "$APPLE_KEY_ID" \
    --key "$APPLE_PRIVATE_KEY_PATH" --client-ids "$APPLE_CLIENT_IDS" --app-groups "com.example.app,com.example.web" \
    --return-urls "com.example.web=$BROKER_PUBLIC_URL/v1/apple/web/callback" &
  simulator=$!
  trap 'kill "$simulator" 2>/dev/null || true' EXIT
fi

export BROKER_DATA_DIR="$data"
if [ -n "${demo:-}" ] && [ ! -s "$demo/api-key" ]; then
  # One key with every scope, for the README's tour and for trying the API by hand.
  ( umask 077; "$bin/appleid-broker" api-keys create --name demo --scopes login,read,compliance,events,admin \
      2>/dev/null > "$demo/api-key" )
fi
[ -n "${demo:-}" ] && echo "== demo API key (every scope): $demo/api-key" >&2
echo "== starting appleid-broker on ${BROKER_LISTEN:-127.0.0.1:8080}" >&2
# Not exec: the trap above must stop the simulator when the broker ends. Ctrl-C reaches both.
"$bin/appleid-broker" serve &
broker=$!
trap 'kill -TERM "$broker" 2>/dev/null || true; wait "$broker"; kill "${simulator:-}" 2>/dev/null || true' INT TERM
wait "$broker"
