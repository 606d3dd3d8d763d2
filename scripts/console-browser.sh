#!/usr/bin/env bash
# The console's browser tests: headless Chromium (Debian's chromium + chromium-driver, driven by
# Selenium) against a broker serving the console on 127.0.0.1, with the Apple simulator and a
# fake OpenID Connect provider on localhost (another site, so SameSite and form-action are the
# browser's real rules). Tests are Tests/ConsoleBrowser/test_*.py (pytest); axe-core comes from
# the axe-playwright-python wheel. Called by scripts/test.sh; runnable on its own.
# Usage: scripts/console-browser.sh [pytest arguments, e.g. -k csrf]
# Ends with "N passed, N failed"; no test collected (pytest's exit 5) is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/appleid-broker-console.XXXXXX")}
BIN=${BROKER_BIN:-$(swift build --show-bin-path)}
[ -x "$BIN/appleid-broker" ] && [ -x "$BIN/apple-sim" ] || swift build
# shellcheck source=lib/stack.sh
source scripts/lib/stack.sh
# shellcheck source=lib/tools-venv.sh
source scripts/lib/tools-venv.sh
for tool in chromium chromedriver; do
  command -v "$tool" >/dev/null || { echo "console-browser: $tool is missing (scripts/bootstrap.sh test installs chromium and chromium-driver)" >&2; exit 1; }
done

IDP_PORT=$(free_port)
CONSOLE_PORT=$(free_port)
idp=
cleanup() { [ -n "$idp" ] && kill "$idp" 2>/dev/null; stop_all; }
trap cleanup EXIT

# The fake identity provider first: the broker reads its discovery document.
export CONSOLE_OIDC_CLIENT_ID=console-tests CONSOLE_OIDC_CLIENT_SECRET=$(openssl rand -hex 16)
"$TOOLS_VENV/bin/python" Tests/ConsoleBrowser/fake_idp.py --port "$IDP_PORT" --client-id "$CONSOLE_OIDC_CLIENT_ID" \
  --client-secret "$CONSOLE_OIDC_CLIENT_SECRET" --ready-file "$WORK/idp.ready" > "$WORK/idp.log" 2>&1 &
idp=$!
wait_until 120 test -s "$WORK/idp.ready" || { cat "$WORK/idp.log" >&2; echo "console-browser: the fake identity provider did not start" >&2; exit 1; }

export CONSOLE_OIDC_ISSUER=http://localhost:$IDP_PORT
export CONSOLE_OIDC_ROLE_MAP=viewers=viewer,ops=operator,dpo=compliance,admins=admin
export BROKER_CONSOLE_LISTEN=127.0.0.1:$CONSOLE_PORT BROKER_CONSOLE_URL=http://127.0.0.1:$CONSOLE_PORT
# Two apps in separate app groups, so a deletion revokes one token per client id.
export APPLE_CLIENT_IDS=com.example.app,com.example.other APPLE_APP_GROUPS='com.example.app;com.example.other'
# Deletions and deliveries move quickly, and a deletion meeting a failing Apple gives up after
# a few attempts, so the journey sees "failed" within seconds.
export BROKER_DELETION_RETRY_BASE_MS=200 BROKER_DELETION_RETRY_MAX_SECONDS=1 BROKER_DELETION_MAX_ATTEMPTS=3
export BROKER_DELETION_INTERVAL_SECONDS=1 APPLE_MAX_ATTEMPTS=1 APPLE_TIMEOUT_MS=2000
export BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS=true BROKER_DISPATCH_INTERVAL_MS=50
start_stack
wait_http "http://127.0.0.1:$CONSOLE_PORT/login"

export CONSOLE_URL=http://127.0.0.1:$CONSOLE_PORT IDP_URL=$CONSOLE_OIDC_ISSUER
export BROKER_URL=http://127.0.0.1:$BROKER_PORT SIM_URL=http://127.0.0.1:$SIM_PORT BROKER_BIN=$BIN
export AXE_JS
AXE_JS=$("$TOOLS_VENV/bin/python" -c 'import importlib.util, os; print(os.path.join(importlib.util.find_spec("axe_playwright_python").submodule_search_locations[0], "axe.min.js"))')
# Selenium must not look for a driver on the network (Selenium Manager): the tests name Debian's.
export SE_OFFLINE=true
echo "== console browser tests: console $CONSOLE_URL, identity provider $IDP_URL, broker $BROKER_URL" >&2
status=0
"$TOOLS_VENV/bin/python" -m pytest "${CONSOLE_BROWSER_TESTS:-Tests/ConsoleBrowser}" -p no:cacheprovider -q -rfE \
  --junitxml "$WORK/junit.xml" "$@" || status=$?
counts=$("$TOOLS_VENV/bin/python" - "$WORK/junit.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print("0 0"); sys.exit()
suites = [root] if root.tag == "testsuite" else list(root)
tests = sum(int(s.get("tests", 0)) for s in suites)
bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
print(tests - bad - skipped, bad)
PY
)
read -r passed failed <<< "$counts"
if [ "$status" = 5 ]; then
  echo "console-browser: no test was collected (pytest exit 5)" >&2
  failed=$((failed + 1))
elif [ "$status" != 0 ] && [ "$failed" = 0 ]; then
  echo "console-browser: pytest exited $status" >&2
  failed=1
fi
stop_all
[ -n "$idp" ] && kill "$idp" 2>/dev/null && wait "$idp" 2>/dev/null || true
idp=
echo "$passed passed, $failed failed"
[ "$failed" = 0 ] || { echo "console-browser: logs (broker, simulator, identity provider) and the pages failed tests ended on are in $WORK" >&2; exit 1; }
rm -rf "$WORK"
