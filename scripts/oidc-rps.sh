#!/usr/bin/env bash
# The OpenID Provider driven by relying parties nobody here wrote (issue 27), as a make test
# stage: PostgreSQL, the Apple simulator and a broker with OIDC_ISSUER (an issuer with a path),
# clients registered over RFC 7591, then
#   1. Authlib (PyPI): code flow + PKCE S256, the ID token verified against the JWKS, userinfo,
#      refresh rotation, RFC 7009 revocation, and every refusal (unregistered redirect_uri,
#      code replay, PKCE mismatch, wrong client secret, reused refresh token; PKCE required
#      for a public client) — scripts/oidc/rp_authlib.py;
#   2. Apache mod_auth_openidc (Debian) protecting a page: a real session cookie, then Apple's
#      consent-revoked ends that session through the broker's Back-Channel Logout, verified by
#      the module itself — scripts/oidc/rp_apache.py;
#   3. mozilla-django-oidc and django-allauth (PyPI), each a real Django app in a temporary folder
#      signing a person in through the broker and the simulator, with what each verifies checked
#      — scripts/oidc/rp_django.py (the broker only: it registers its own clients).
# OIDC_RPS_OP=glewlwyd runs the same relying parties against Glewlwyd 2.7 (Debian) instead:
# the harness checked against a provider nobody here wrote.
# A missing package is an error under CI=true and a skip (with the install command) otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
OP=${OIDC_RPS_OP:-broker}
export WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/appleid-broker-oidc-rps.XXXXXX")}

missing=()
command -v apache2 >/dev/null || [ -x /usr/sbin/apache2 ] || missing+=("apache2 (apt: apache2)")
[ -f /usr/lib/apache2/modules/mod_auth_openidc.so ] || missing+=("mod_auth_openidc (apt: libapache2-mod-auth-openidc)")
# shellcheck source=lib/stack.sh
source scripts/lib/stack.sh
# shellcheck source=lib/glewlwyd.sh
source scripts/lib/glewlwyd.sh
if [ "$OP" = glewlwyd ]; then
  while IFS= read -r line; do [ -n "$line" ] && missing+=("$line"); done < <(glewlwyd_missing)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "oidc-rps: missing ${missing[*]}; scripts/bootstrap.sh test installs them" >&2
  [ "${CI:-}" = true ] && exit 1
  echo "oidc-rps: SKIPPED (not under CI): no relying party ran" >&2
  exit 0
fi

BIN=${BROKER_BIN:-$(swift build --show-bin-path)}
[ -x "$BIN/appleid-broker" ] && [ -x "$BIN/apple-sim" ] || swift build
# shellcheck source=lib/tools-venv.sh
source scripts/lib/tools-venv.sh
PY=$TOOLS_VENV/bin/python
cleanup() { stop_glewlwyd; stop_all; }
trap cleanup EXIT

APACHE_PORT=$(free_port)
export APACHE_PORT APACHE_DIR=$WORK/apache
rp_redirect=http://127.0.0.1:$(free_port)/callback
apache_redirect=http://127.0.0.1:$APACHE_PORT/protected/redirect_uri

if [ "$OP" = glewlwyd ]; then
  start_glewlwyd "$PY" "$rp_redirect" "$apache_redirect"
  export OP_KIND=glewlwyd OIDC_ISSUER=$GLEWLWYD_ISSUER RP_SCOPE=openid APACHE_SCOPE=openid
  export RP_CLIENT_ID=$GLEWLWYD_CLIENT_ID RP_CLIENT_SECRET=$GLEWLWYD_CLIENT_SECRET
  export APACHE_CLIENT_ID=$GLEWLWYD_CLIENT_ID APACHE_CLIENT_SECRET=$GLEWLWYD_CLIENT_SECRET
else
  # The provider signs users in with a Services ID; Apple posts back to the web sign-in's
  # Return URL, registered at the simulator as at developer.apple.com. Logout tokens go to
  # loopback receivers, and the dispatcher polls quickly.
  export APPLE_CLIENT_IDS=com.example.app,com.example.web OIDC_APPLE_CLIENT_ID=com.example.web
  export APPLE_APP_GROUPS=com.example.app=com.example.web
  export BROKER_PUBLIC_URL=http://127.0.0.1:$BROKER_PORT OIDC_ISSUER=http://127.0.0.1:$BROKER_PORT/oidc
  export SIM_RETURN_URLS="com.example.web=$BROKER_PUBLIC_URL/v1/apple/web/callback"
  export BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS=true BROKER_DISPATCH_INTERVAL_MS=50
  start_stack
  curl -sf -o /dev/null "$OIDC_ISSUER/.well-known/openid-configuration" ||
    { echo "oidc-rps: the broker serves no OpenID Provider at $OIDC_ISSUER (see $WORK/broker.log)" >&2; exit 1; }
  register() {  # register JSON: RFC 7591 with the admin API key (the initial access token)
    "$PY" - "$OIDC_ISSUER" "$API_KEY" "$1" <<'PY'
import json, sys, requests
issuer, key, metadata = sys.argv[1:]
endpoint = requests.get(issuer + "/.well-known/openid-configuration").json()["registration_endpoint"]
answer = requests.post(endpoint, json=json.loads(metadata), headers={"Authorization": f"Bearer {key}"})
if answer.status_code != 201:
    sys.exit(f"registration: {answer.status_code} {answer.text}")
client = answer.json()
print(client["client_id"], client.get("client_secret", ""))
PY
  }
  # Assignments, so that a refused registration stops the script (set -e).
  credentials=$(register "{\"client_name\":\"authlib\",\"redirect_uris\":[\"$rp_redirect\"],
    \"token_endpoint_auth_method\":\"client_secret_basic\",\"grant_types\":[\"authorization_code\",\"refresh_token\"],
    \"scope\":\"openid email profile offline_access\"}")
  read -r RP_CLIENT_ID RP_CLIENT_SECRET <<< "$credentials"
  credentials=$(register "{\"client_name\":\"authlib public\",\"redirect_uris\":[\"$rp_redirect\"],
    \"token_endpoint_auth_method\":\"none\",\"grant_types\":[\"authorization_code\"],\"scope\":\"openid\"}")
  read -r RP_PUBLIC_CLIENT_ID _ <<< "$credentials"
  credentials=$(register "{\"client_name\":\"mod_auth_openidc\",
    \"redirect_uris\":[\"$apache_redirect\"],\"token_endpoint_auth_method\":\"client_secret_basic\",
    \"scope\":\"openid email profile\",\"backchannel_logout_uri\":\"$apache_redirect?logout=backchannel\",
    \"backchannel_logout_session_required\":true}")
  read -r APACHE_CLIENT_ID APACHE_CLIENT_SECRET <<< "$credentials"
  export OP_KIND=broker RP_SCOPE="openid email profile offline_access" APACHE_SCOPE="openid email profile"
  export RP_CLIENT_ID RP_CLIENT_SECRET RP_PUBLIC_CLIENT_ID APACHE_CLIENT_ID APACHE_CLIENT_SECRET
  export BROKER_URL=http://127.0.0.1:$BROKER_PORT SIM_URL=http://127.0.0.1:$SIM_PORT API_KEY APPLE_PRIMARY_APP_ID=com.example.app
fi
export RP_REDIRECT_URI=$rp_redirect
echo "== relying parties against $OP at $OIDC_ISSUER" >&2
status=0
"$PY" scripts/oidc/rp_authlib.py || status=1
"$PY" scripts/oidc/rp_apache.py || status=1
if [ "$OP" = broker ]; then
  "$PY" scripts/oidc/rp_django.py || status=1
fi
cleanup
trap - EXIT
[ $status = 0 ] && rm -rf "$WORK"
exit $status
