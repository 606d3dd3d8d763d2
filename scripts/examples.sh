#!/usr/bin/env bash
# The integration examples against a live broker, as an app backend would run them: for
# Python, Node and Go (standard libraries only), a webhook receiver that subscribes and
# verifies Standard Webhooks signatures (and refuses a tampered delivery), the login call
# with a nonce made as the app makes it, and a feed reader that keeps its cursor. Every
# recorded delivery is verified once more with the official `standardwebhooks` PyPI
# package, and a tampered copy must fail it. Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/appleid-broker-examples.XXXXXX")}
BIN=${BROKER_BIN:-$(swift build --show-bin-path)}
[ -x "$BIN/appleid-broker" ] && [ -x "$BIN/apple-sim" ] || swift build
# shellcheck source=lib/stack.sh
source scripts/lib/stack.sh
# shellcheck source=lib/tools-venv.sh
source scripts/lib/tools-venv.sh
for tool in node go; do
  command -v "$tool" >/dev/null || { echo "examples: $tool is missing (scripts/bootstrap.sh test installs nodejs and golang-go)" >&2; exit 1; }
done

receiver=
cleanup() { [ -n "$receiver" ] && kill "$receiver" 2>/dev/null; stop_all; }
trap cleanup EXIT
# The receivers listen on loopback; deliveries come back quickly.
export BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS=true BROKER_DISPATCH_INTERVAL_MS=50
start_stack
echo "== examples against 127.0.0.1:$BROKER_PORT" >&2
export GOCACHE=$WORK/go-cache GOPATH=$WORK/go GOFLAGS=-mod=mod
(cd examples/go && go build -o "$WORK/go-example" .)

fail() { echo "examples ($1): $2" >&2; exit 1; }
json_field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get(sys.argv[2], ""))' "$1" "$2"; }

for lang in python node go; do
  port=$(free_port)
  ready=$WORK/$lang.ready record=$WORK/$lang.deliveries
  rm -f "$ready" "$record" "$WORK/$lang.cursor"
  case $lang in
    python) receive=(python3 examples/webhook_receiver.py --broker "http://127.0.0.1:$BROKER_PORT" --key "$API_KEY" --port "$port")
            login=(python3 examples/login.py --broker "http://127.0.0.1:$BROKER_PORT" --key "$API_KEY")
            feed=(python3 examples/feed_reader.py --broker "http://127.0.0.1:$BROKER_PORT" --key "$API_KEY") ;;
    node)   receive=(node examples/node/broker-example.mjs webhooks --broker "http://127.0.0.1:$BROKER_PORT" --key "$API_KEY" --port "$port")
            login=(node examples/node/broker-example.mjs login --broker "http://127.0.0.1:$BROKER_PORT" --key "$API_KEY")
            feed=(node examples/node/broker-example.mjs feed --broker "http://127.0.0.1:$BROKER_PORT" --key "$API_KEY") ;;
    go)     receive=("$WORK/go-example" webhooks -broker "http://127.0.0.1:$BROKER_PORT" -key "$API_KEY" -port "$port")
            login=("$WORK/go-example" login -broker "http://127.0.0.1:$BROKER_PORT" -key "$API_KEY")
            feed=("$WORK/go-example" feed -broker "http://127.0.0.1:$BROKER_PORT" -key "$API_KEY") ;;
  esac
  dash=--; [ "$lang" = go ] && dash=-
  "${receive[@]}" "${dash}exit-after" user.created "${dash}ready-file" "$ready" "${dash}record" "$record" > "$WORK/$lang.receiver.log" 2>&1 &
  receiver=$!
  wait_until 120 test -s "$ready" || fail "$lang" "the receiver did not subscribe: $(cat "$WORK/$lang.receiver.log")"

  # A forged delivery is refused.
  forged=$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$port/hooks/appleid" -H 'Content-Type: application/json' \
    -H 'webhook-id: msg_forged' -H "webhook-timestamp: $(date +%s)" -H 'webhook-signature: v1,bm90IGEgc2lnbmF0dXJl' -d '{"type":"user.deleted"}')
  [ "$forged" = 401 ] || fail "$lang" "a forged delivery was answered $forged, not 401"

  # The app's side: a raw nonce, its lowercase hex SHA-256 in the Apple request (here the
  # simulator playing Apple), the raw one to the backend.
  raw_nonce=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
  hashed=$(python3 -c 'import hashlib,sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())' "$raw_nonce")
  minted=$(curl -sf -X POST "http://127.0.0.1:$SIM_PORT/sim/tokens" -H 'Content-Type: application/json' \
    -d "{\"client_id\":\"$APPLE_CLIENT_IDS\",\"with_code\":true,\"nonce_claim\":\"$hashed\"}")
  answer=$("${login[@]}" "${dash}identity-token" "$(json_field "$minted" id_token)" \
    "${dash}authorization-code" "$(json_field "$minted" code)" "${dash}raw-nonce" "$raw_nonce")
  [ "$(json_field "$answer" is_new_user)" = True ] || fail "$lang" "login answered $answer"
  [ "$(json_field "$answer" refresh_token_stored)" = True ] || fail "$lang" "no refresh token stored: $answer"
  # The same token with another raw nonce is refused (nonce_mismatch), as the example reports.
  if "${login[@]}" "${dash}identity-token" "$(json_field "$minted" id_token)" "${dash}raw-nonce" wrong > /dev/null 2> "$WORK/$lang.mismatch"; then
    fail "$lang" "a wrong raw nonce was accepted"
  fi
  grep -q nonce_mismatch "$WORK/$lang.mismatch" || fail "$lang" "a wrong nonce did not report nonce_mismatch: $(cat "$WORK/$lang.mismatch")"

  if ! wait_until 120 eval '! kill -0 "$receiver" 2>/dev/null'; then fail "$lang" "the receiver never got user.created: $(cat "$WORK/$lang.receiver.log")"; fi
  wait "$receiver" || fail "$lang" "the receiver failed: $(cat "$WORK/$lang.receiver.log")"
  receiver=
  [ -s "$record" ] || fail "$lang" "no verified delivery recorded"

  # The feed: everything once, then nothing new from the kept cursor.
  "${feed[@]}" "${dash}cursor-file" "$WORK/$lang.cursor" > "$WORK/$lang.feed1" 2> "$WORK/$lang.feed1.err"
  grep -q ' user.created ' "$WORK/$lang.feed1" || fail "$lang" "the feed has no user.created: $(cat "$WORK/$lang.feed1")"
  "${feed[@]}" "${dash}cursor-file" "$WORK/$lang.cursor" > "$WORK/$lang.feed2" 2> "$WORK/$lang.feed2.err"
  grep -q '^0 new events' "$WORK/$lang.feed2.err" || fail "$lang" "the cursor was not kept: $(cat "$WORK/$lang.feed2.err")"
  # A delivery and the feed name the same event.
  delivered_id=$(python3 -c 'import json,sys; print(json.loads(json.loads(open(sys.argv[1]).readline())["body"])["id"])' "$record")
  grep -q "^$delivered_id " "$WORK/$lang.feed1" || fail "$lang" "the delivered event $delivered_id is not in the feed"
  echo "examples ($lang): login, nonce, verified webhook ($(wc -l < "$record") deliveries, forged one refused), feed with cursor: ok" >&2
done

# The official Standard Webhooks library agrees with every example, and refuses a tampered body.
"$TOOLS_VENV/bin/python" - "$WORK"/*.deliveries <<'PY'
import json, sys
import jsonschema
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
# Each body must also be what the description's `webhooks` section says for its type.
description = json.load(open("docs/openapi.json"))
checked = 0
for path in sys.argv[1:]:
    for line in open(path):
        delivery = json.loads(line)
        hook = Webhook(delivery["secret"])
        hook.verify(delivery["body"], delivery["headers"])
        body = json.loads(delivery["body"])
        model = description["webhooks"][body["type"]]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        jsonschema.Draft202012Validator({"$ref": model, "components": description["components"]}).validate(body)
        try:
            hook.verify(delivery["body"].replace('"type"', '"typ3"', 1), delivery["headers"])
        except WebhookVerificationError:
            pass
        else:
            sys.exit(f"{path}: a tampered delivery verified")
        checked += 1
print(f"examples: standardwebhooks verified {checked} deliveries (each matching its `webhooks` schema) and refused each tampered copy", file=sys.stderr)
PY
stop_all
rm -rf "$WORK"
