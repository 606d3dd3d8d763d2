#!/usr/bin/env bash
# Runs appleid-broker on this machine: installs missing Debian packages, builds (release),
# and starts the service with an embedded PostgreSQL. Without Apple settings in the
# environment it runs a local demo: it creates demo credentials in .appleid-broker/demo,
# points the broker at the Apple simulator on 127.0.0.1:8090 (APPLE_SIM_LISTEN moves it;
# BROKER_LISTEN moves the broker from 127.0.0.1:8080), turns on the OpenID Provider (issuer
# on the broker's address, /oidc) and the operators' console (127.0.0.1:8081;
# BROKER_CONSOLE_LISTEN moves it), and prints, once the broker is ready, the provider's
# discovery URL, how to register a relying party and a console sign-in link.
# With Apple settings (APPLE_CLIENT_IDS) it turns on nothing that the environment does not.
# Stop with Ctrl-C (SIGINT), SIGTERM or SIGHUP (a closed terminal): the simulator, the
# broker (and with it the console) and the embedded PostgreSQL all stop.
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
  # One app group, as at developer.apple.com: the web's Services ID grouped with the app's App
  # ID, its primary. Explicit: with several client ids the broker wants to be told the groups.
  export APPLE_APP_GROUPS="com.example.app=com.example.web"
  # The simulator's address: APPLE_SIM_LISTEN moves it (scripts/tour.sh does when 8090 is taken).
  sim_listen="${APPLE_SIM_LISTEN:-127.0.0.1:8090}"
  export APPLE_BASE_URL="${APPLE_BASE_URL:-http://$sim_listen}"
  export TOKEN_ENCRYPTION_KEY="$(cat "$demo/token-encryption-key")"
  # Web sign-in through the broker for the Services ID, ending at an app's page on :3000.
  broker_listen="${BROKER_LISTEN:-127.0.0.1:8080}"
  export BROKER_PUBLIC_URL="${BROKER_PUBLIC_URL:-http://${broker_listen/#0.0.0.0:/127.0.0.1:}}"
  export APPLE_WEB_RETURN_URLS="${APPLE_WEB_RETURN_URLS:-com.example.web=http://localhost:3000/apple/done}"
  # The tour's webhook receiver is on this machine; outside the demo receivers must be public.
  export BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS="${BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS:-true}"
  # The OpenID Provider on the broker's own address, signing people in at "Apple" with the
  # Services ID, whose Return URL (the web sign-in's) the simulator has registered.
  export OIDC_ISSUER="${OIDC_ISSUER:-$BROKER_PUBLIC_URL/oidc}" OIDC_APPLE_CLIENT_ID="${OIDC_APPLE_CLIENT_ID:-com.example.web}"
  # The operators' console, on a listener of its own.
  export BROKER_CONSOLE_LISTEN="${BROKER_CONSOLE_LISTEN:-127.0.0.1:8081}"
  export BROKER_CONSOLE_URL="${BROKER_CONSOLE_URL:-http://${BROKER_CONSOLE_LISTEN/#0.0.0.0:/127.0.0.1:}}"
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

# The demo's faces, printed once the broker answers /readyz (or nothing, if it never does).
announce_demo() {
  while ! "$bin/appleid-broker" healthcheck 2>/dev/null; do
    kill -0 "$broker" 2>/dev/null || return 0
    sleep 0.5
  done
  local cli=".build/release/appleid-broker" link
  # The CLI finds the data where make run keeps it only from the checkout, by default.
  [ "$data" = "$PWD/.appleid-broker" ] || cli="BROKER_DATA_DIR=$data $cli"
  [ "$BROKER_CONSOLE_URL" = "http://$BROKER_CONSOLE_LISTEN" ] || cli="BROKER_CONSOLE_URL=$BROKER_CONSOLE_URL $cli"
  link=$("$bin/appleid-broker" console link --operator demo --role viewer,operator,compliance,admin --ttl 10m \
    2>/dev/null) || link="(not made: see the broker's log)"
  cat >&2 <<EOF
== ready: the API on $BROKER_PUBLIC_URL (API key with every scope: $demo/api-key)
== the OpenID Provider: $OIDC_ISSUER/.well-known/openid-configuration
   register a relying party (RFC 7591 with the demo key; the answer holds its client_id and client_secret):
     curl -s $OIDC_ISSUER/register -H "Authorization: Bearer \$(cat $demo/api-key)" -H 'Content-Type: application/json' \\
       -d '{"client_name":"my site","redirect_uris":["http://127.0.0.1:9001/callback"]}'
== the console: $BROKER_CONSOLE_URL; sign in as "demo" with every role (once, within 10 minutes):
     $link
   a fresh link: BROKER_CONSOLE_LISTEN=$BROKER_CONSOLE_LISTEN $cli console link --operator demo --role viewer,operator,compliance,admin
EOF
}

echo "== starting appleid-broker on ${BROKER_LISTEN:-127.0.0.1:8080}" >&2
# Not exec: the trap above must stop the simulator when the broker ends. Ctrl-C reaches both.
"$bin/appleid-broker" serve &
broker=$!
announcer=
if [ -n "${demo:-}" ]; then
  announce_demo &
  announcer=$!
fi
# Ctrl-C, SIGTERM, or a closed terminal (SIGHUP): the broker stops (its console with it), then
# the simulator; the embedded PostgreSQL stops with the last process using it.
stop() {
  [ -z "$announcer" ] || kill "$announcer" 2>/dev/null || true
  kill -TERM "$broker" 2>/dev/null || true
  wait "$broker"
}
trap stop INT TERM HUP
wait "$broker"
