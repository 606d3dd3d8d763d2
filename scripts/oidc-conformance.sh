#!/usr/bin/env bash
# The OpenID Foundation's OP conformance plans (Basic, Config, Form Post, RP-Initiated Logout,
# Back-Channel Logout), one test per module of openid-certification/conformance-suite, against
# the broker serving HTTPS (a throwaway certificate authority from the openssl CLI) with the
# Apple simulator: scripts/oidc/conformance.py (issue 36; docs/oidc.md lists what passes).
# Each plan is run by one browser; the whole run by one simulated person at Apple (one Apple ID,
# more than ten sign-ins: the run fails if all five plans make fewer).
# Usage: scripts/oidc-conformance.sh [PLAN ...]   (basic config form-post rp-initiated backchannel)
#   CONFORMANCE_FRESH_LOGIN=all also clears the browser's cookies where a module's summary asks
#   for it only to show a login page (one more sign-in at Apple each).
set -euo pipefail
cd "$(dirname "$0")/.."
export WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/appleid-broker-oidc-conformance.XXXXXX")}
BIN=${BROKER_BIN:-$(swift build --show-bin-path)}
[ -x "$BIN/appleid-broker" ] && [ -x "$BIN/apple-sim" ] || swift build
# shellcheck source=lib/stack.sh
source scripts/lib/stack.sh
# shellcheck source=lib/tools-venv.sh
source scripts/lib/tools-venv.sh
trap stop_all EXIT

# TLS: a certificate authority of this run and a certificate for 127.0.0.1 it signs.
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$WORK/ca.key" -out "$WORK/ca.pem" -days 1 -subj "/CN=conformance CA" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout "$WORK/key.pem" -out "$WORK/cert.csr" -subj "/CN=127.0.0.1" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' > "$WORK/san.ext"
openssl x509 -req -in "$WORK/cert.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" -CAcreateserial -days 1 \
  -extfile "$WORK/san.ext" -out "$WORK/cert.pem" 2>/dev/null
export BROKER_TLS_CERT_PATH=$WORK/cert.pem BROKER_TLS_KEY_PATH=$WORK/key.pem STACK_CA=$WORK/ca.pem

export APPLE_CLIENT_IDS=com.example.app,com.example.web OIDC_APPLE_CLIENT_ID=com.example.web
# One authorization at Apple for both (the broker requires the groups once it has several client ids).
export APPLE_APP_GROUPS=com.example.app=com.example.web
export BROKER_PUBLIC_URL=https://127.0.0.1:$BROKER_PORT OIDC_ISSUER=https://127.0.0.1:$BROKER_PORT/oidc
export SIM_RETURN_URLS="com.example.web=$BROKER_PUBLIC_URL/v1/apple/web/callback"
# Back-Channel Logout goes to this script's loopback receiver; the dispatcher polls quickly.
export BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS=true BROKER_DISPATCH_INTERVAL_MS=50
start_stack
curl -sf --cacert "$STACK_CA" -o /dev/null "$OIDC_ISSUER/.well-known/openid-configuration" ||
  { echo "oidc-conformance: the broker serves no OpenID Provider at $OIDC_ISSUER (see $WORK/broker.log)" >&2; exit 1; }

status=0
ISSUER=$OIDC_ISSUER CA=$STACK_CA API_KEY=$API_KEY SIM_URL=http://127.0.0.1:$SIM_PORT RP_PORT=$(free_port) \
  "$TOOLS_VENV/bin/python" scripts/oidc/conformance.py "$@" || status=1
stop_all
trap - EXIT
if [ $status = 0 ]; then rm -rf "$WORK"; else echo "oidc-conformance: logs in $WORK" >&2; fi
exit $status
