#!/usr/bin/env bash
# API conformance: runs Schemathesis (PyPI) against a live broker on loopback. Every
# response must match docs/openapi.json (status, content type, headers, body schema) and
# no request may be answered 500. Called by scripts/test.sh; runnable on its own.
#   1. scripts/api-cases.py: the requests schemathesis once failed on, pinned, sent every run;
#   2. `st run` with a fixed seed (SCHEMATHESIS_SEED, default below), one worker and no example
#      database, so that the same commit draws the same requests in the same order every time.
# `make fuzz-api` (scripts/fuzz-api.sh) runs the same with a random seed, which it prints.
# Usage: [SCHEMATHESIS_SEED=N] scripts/api-conformance.sh [max examples per operation, default 25]
#        scripts/api-conformance.sh --cases    (the pinned cases only, in seconds)
set -euo pipefail
cd "$(dirname "$0")/.."
CASES_ONLY=
[ "${1:-}" = --cases ] && { CASES_ONLY=1; shift; }
MAX_EXAMPLES=${1:-25}
# The seed make test uses; changing it is changing the test (docs/testing.md).
SEED=${SCHEMATHESIS_SEED:-37}
# A directory and ports of this run's own (scripts/lib/stack.sh picks free ports).
export WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/appleid-broker-conformance.XXXXXX")}
BIN=${BROKER_BIN:-$(swift build --show-bin-path)}
[ -x "$BIN/appleid-broker" ] && [ -x "$BIN/apple-sim" ] || swift build
# shellcheck source=lib/stack.sh
source scripts/lib/stack.sh

# shellcheck source=lib/tools-venv.sh
source scripts/lib/tools-venv.sh

trap stop_all EXIT
# Schemathesis sends thousands of requests from one key and one address.
export BROKER_RATE_LIMIT_PER_KEY=0 BROKER_RATE_LIMIT_NOTIFICATIONS_PER_IP=0 BROKER_RATE_LIMIT_AUTH_FAILURES_PER_IP=0 BROKER_ACCESS_LOG=false
# Web sign-in configured, so its endpoints are checked past 404 web_signin_not_configured.
export BROKER_PUBLIC_URL=http://127.0.0.1:$BROKER_PORT APPLE_WEB_RETURN_URLS=com.example.app=http://127.0.0.1:9/done
# The OpenID Provider on, issuer without a path, as docs/openapi.json writes its paths.
export OIDC_ISSUER=http://127.0.0.1:$BROKER_PORT OIDC_APPLE_CLIENT_ID=com.example.app
start_stack
# One real user, made by a login with a simulator-minted token and authorization code.
minted=$(curl -sf -X POST "http://127.0.0.1:$SIM_PORT/sim/tokens" -H 'Content-Type: application/json' \
  -d "{\"client_id\":\"$APPLE_CLIENT_IDS\",\"with_code\":true}")
login=$(python3 -c 'import json,sys; m=json.loads(sys.argv[1]); print(json.dumps({"identity_token": m["id_token"], "authorization_code": m["code"]}))' "$minted")
CONFORMANCE_USER_ID=$(curl -sf -X POST "http://127.0.0.1:$BROKER_PORT/v1/apple/login" -H "Authorization: Bearer $API_KEY" \
  -H 'Content-Type: application/json' -d "$login" | python3 -c 'import json,sys; print(json.load(sys.stdin)["user_id"])')
export CONFORMANCE_USER_ID
echo "== pinned cases (scripts/api-cases.py)" >&2
"$TOOLS_VENV/bin/python" scripts/api-cases.py "http://127.0.0.1:$BROKER_PORT"
[ -n "$CASES_ONLY" ] && { stop_all; rm -rf "$WORK"; exit 0; }
echo "== schemathesis: seed $SEED, $MAX_EXAMPLES examples per operation against 127.0.0.1:$BROKER_PORT" >&2
# The served description is docs/openapi.json, embedded into the binary at build time.
# Hypothesis's too_slow health check is the one that depends on the machine's speed: off.
"$TOOLS_VENV/bin/st" --config-file schemathesis.toml run "http://127.0.0.1:$BROKER_PORT/openapi.json" \
  --header "Authorization: Bearer $API_KEY" --max-examples "$MAX_EXAMPLES" \
  --seed "$SEED" --workers 1 --generation-database none --suppress-health-check too_slow \
  --no-color --report junit --report-dir "$WORK/report" || {
  echo "schemathesis failed with seed $SEED: replay with SCHEMATHESIS_SEED=$SEED scripts/api-conformance.sh $MAX_EXAMPLES" >&2
  exit 1
}
stop_all
rm -rf "$WORK"
