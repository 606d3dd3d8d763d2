#!/usr/bin/env bash
# A single-page application signing in through the OpenID Provider in headless Chromium
# (Debian's chromium + chromium-driver, Selenium), as scripts/console-browser.sh drives the
# console: PKCE S256, the token endpoint and userinfo by fetch() across origins (CORS), silent
# renewal with prompt=none from the provider's session (issue 36). The SPA is
# scripts/oidc/spa/ (plain HTML and JavaScript), its test scripts/oidc/spa/test_spa.py.
# Usage: scripts/oidc-spa-browser.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
export WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/appleid-broker-oidc-spa.XXXXXX")}
BIN=${BROKER_BIN:-$(swift build --show-bin-path)}
[ -x "$BIN/appleid-broker" ] && [ -x "$BIN/apple-sim" ] || swift build
# shellcheck source=lib/stack.sh
source scripts/lib/stack.sh
# shellcheck source=lib/tools-venv.sh
source scripts/lib/tools-venv.sh
for tool in chromium chromedriver; do
  command -v "$tool" >/dev/null || { echo "oidc-spa-browser: $tool is missing (scripts/bootstrap.sh test installs chromium and chromium-driver)" >&2; exit 1; }
done
trap stop_all EXIT
export APPLE_CLIENT_IDS=com.example.app,com.example.web OIDC_APPLE_CLIENT_ID=com.example.web
# One authorization at Apple for both (the broker requires the groups once it has several client ids).
export APPLE_APP_GROUPS=com.example.app=com.example.web
export BROKER_PUBLIC_URL=http://127.0.0.1:$BROKER_PORT OIDC_ISSUER=http://127.0.0.1:$BROKER_PORT/oidc
export SIM_RETURN_URLS="com.example.web=$BROKER_PUBLIC_URL/v1/apple/web/callback"
start_stack
export ISSUER=$OIDC_ISSUER SIM_URL=http://127.0.0.1:$SIM_PORT API_KEY SE_OFFLINE=true
status=0
"$TOOLS_VENV/bin/python" -m pytest scripts/oidc/spa/test_spa.py -p no:cacheprovider -q -rfE "$@" || status=$?
stop_all
trap - EXIT
if [ $status = 0 ]; then rm -rf "$WORK"; else echo "oidc-spa-browser: logs in $WORK" >&2; fi
exit $status
