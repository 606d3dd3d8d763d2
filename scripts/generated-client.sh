#!/usr/bin/env bash
# A client generated from docs/openapi.json by a tool nobody here wrote
# (openapi-python-client, PyPI), used as an app backend would: a real login with a
# simulator-minted token, then a user read, through the generated models and calls only.
# Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/appleid-broker-generated.XXXXXX")}
BIN=${BROKER_BIN:-$(swift build --show-bin-path)}
[ -x "$BIN/appleid-broker" ] && [ -x "$BIN/apple-sim" ] || swift build
# shellcheck source=lib/stack.sh
source scripts/lib/stack.sh
trap stop_all EXIT

# shellcheck source=lib/generator-venv.sh
source scripts/lib/generator-venv.sh
venv=$GENERATOR_VENV
rm -rf "$WORK/client"
# No post-generation hooks (they run ruff, which is not needed to use the client).
printf 'post_hooks: []\n' > "$WORK/generator.yml"
(cd "$WORK" && "$venv/bin/openapi-python-client" generate --path "$ROOT/docs/openapi.json" --output-path "$WORK/client" \
  --meta setup --config "$WORK/generator.yml" > "$WORK/generate.log" 2>&1) || { cat "$WORK/generate.log" >&2; exit 1; }
# The generator says what it could not model; a body it gives up on becomes `Any`.
if grep -qi "warning" "$WORK/generate.log"; then
  echo "generated-client: openapi-python-client warned:" >&2; cat "$WORK/generate.log" >&2; exit 1
fi
# Installed into a directory of this run's own (its dependencies are the generator's), so the
# machine's generator venv stays as installed.
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --target "$WORK/site" "$WORK/client"
export PYTHONPATH=$WORK/site

start_stack
minted=$(curl -sf -X POST "http://127.0.0.1:$SIM_PORT/sim/tokens" -H 'Content-Type: application/json' \
  -d "{\"client_id\":\"$APPLE_CLIENT_IDS\",\"with_code\":true,\"raw_nonce\":\"generated-client-nonce\"}")
"$venv/bin/python" - "http://127.0.0.1:$BROKER_PORT" "$API_KEY" "$minted" <<'PY'
import importlib, json, pkgutil, sys
base, key, minted = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
name = next(m.name for m in pkgutil.iter_modules() if m.name.endswith("_client") and m.name.startswith("appleid"))
package = importlib.import_module(name)
models = importlib.import_module(name + ".models")
client = package.AuthenticatedClient(base_url=base, token=key)
login_api = importlib.import_module(name + ".api.login.login")
users_api = importlib.import_module(name + ".api.users.get_user")
deletions_models = [m for m in dir(models) if m == "DeletionRequest"]
assert deletions_models, "DeletionRequest has no model of its own"
assert hasattr(models, "RealUserStatus"), "real_user_status has no enum of its own"
body = models.LoginRequest(identity_token=minted["id_token"], authorization_code=minted["code"], raw_nonce="generated-client-nonce")
answer = login_api.sync(client=client, body=body)
assert isinstance(answer, models.LoginResponse), f"login answered {answer!r}"
assert answer.is_new_user and answer.refresh_token_stored, answer
assert isinstance(answer.real_user_status, models.RealUserStatus), answer.real_user_status
user = users_api.sync(id=answer.user_id, client=client)
assert isinstance(user, models.User) and str(user.user_id) == str(answer.user_id), user
print(f"generated-client: login and user read through {name}: user {answer.user_id}, {len(user.identities)} identity", file=sys.stderr)
PY
stop_all
rm -rf "$WORK"
