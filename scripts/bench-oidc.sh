#!/usr/bin/env bash
# make bench-oidc: the OpenID Provider's token endpoint (code exchanges), userinfo, whole sign-ins
# (the broker's through Apple, the simulator) and prompt=none renewals from a live session against
# Glewlwyd 2.7 from Debian (an OpenID Certified provider in C: its OIDC plugin, RS256 with a
# 2048-bit key like the broker's, one user, one confidential client), both in one run on this
# machine, in interleaved rounds; codes are minted before each round by each side's own
# authorize flow. Each side has its own PostgreSQL cluster, set up alike (GLEWLWYD_DB=sqlite
# gives Glewlwyd a sqlite file instead). Figures per second and per CPU-second of the server
# process, and of it with its PostgreSQL; the ratio is the median of the per-round ratios
# (issue 27's goal: >= 2x per CPU-second).
#   [ROUNDS=3] [CODES=200] [CONCURRENCY=8] [USERINFO=2000] [GLEWLWYD_DB=postgres|sqlite] scripts/bench-oidc.sh
. "$(dirname "$0")/bench/common.sh"
"$ROOT/scripts/bootstrap.sh" test
# shellcheck source=lib/glewlwyd.sh
source "$ROOT/scripts/lib/glewlwyd.sh"
# shellcheck source=lib/tools-venv.sh
source "$ROOT/scripts/lib/tools-venv.sh"
missing=$(glewlwyd_missing)
[ -z "$missing" ] || { echo "bench-oidc: missing $missing (scripts/bootstrap.sh test installs it)" >&2; exit 1; }
build_release
trap 'stop_glewlwyd; stop_all' EXIT
PY=$TOOLS_VENV/bin/python

export APPLE_CLIENT_IDS=com.example.app,com.example.web OIDC_APPLE_CLIENT_ID=com.example.web
export APPLE_APP_GROUPS=com.example.app=com.example.web
export BROKER_PUBLIC_URL=http://127.0.0.1:$BROKER_PORT OIDC_ISSUER=http://127.0.0.1:$BROKER_PORT/oidc
export SIM_RETURN_URLS="com.example.web=$BROKER_PUBLIC_URL/v1/apple/web/callback"
start_stack
curl -sf -o /dev/null "$OIDC_ISSUER/.well-known/openid-configuration" ||
  { echo "bench-oidc: the broker serves no OpenID Provider at $OIDC_ISSUER" >&2; exit 1; }
# The relying party's redirect URIs are never fetched: the code is read from the redirect.
broker_redirect=http://127.0.0.1:9/bench/broker glewlwyd_redirect=http://127.0.0.1:9/bench/glewlwyd
registration=$("$BIN/appleid-broker" oidc-clients create --name bench --redirect-uris "$broker_redirect" \
  --auth-method client_secret_basic --scope openid)
read -r BROKER_CLIENT_ID BROKER_CLIENT_SECRET < <("$PY" -c \
  'import json,sys; c=json.loads(sys.argv[1]); print(c["client_id"], c["client_secret"])' "$registration")
# One Glewlwyd user per concurrent browser: whole sign-ins and renewals are several people at once.
export GLEWLWYD_EXTRA_USERS=${CONCURRENCY:-8}
start_glewlwyd "$PY" "$glewlwyd_redirect"
echo "== OIDC: broker (release) vs Glewlwyd $(dpkg-query -W -f='${Version}' glewlwyd) on $GLEWLWYD_DB, ${ROUNDS:-3} interleaved rounds" \
  "of ${CODES:-200} code exchanges at concurrency ${CONCURRENCY:-8} and ${USERINFO:-2000} userinfo calls (nproc $(nproc))"
BROKER_ISSUER=$OIDC_ISSUER BROKER_CLIENT_ID=$BROKER_CLIENT_ID BROKER_CLIENT_SECRET=$BROKER_CLIENT_SECRET \
  BROKER_REDIRECT_URI=$broker_redirect BROKER_SERVER_PID=$BROKER_PID BROKER_POSTMASTER_PID="$(head -1 "$WORK/data/postgres/postmaster.pid")" \
  GLEWLWYD_REDIRECT_URI=$glewlwyd_redirect GLEWLWYD_POSTMASTER_PID=$GLEWLWYD_POSTMASTER_PID GLEWLWYD_DB=$GLEWLWYD_DB \
  ROUNDS=${ROUNDS:-3} \
  "$PY" "$ROOT/scripts/oidc/bench_oidc.py" "$RESULTS/oidc.json"
echo "written: bench-results/oidc.json"
