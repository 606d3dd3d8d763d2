#!/usr/bin/env bash
# Runs the README's 5-minute tour exactly as written, the way a newcomer would: `make run`
# (scripts/run.sh) in the background, then every ```sh tour block of README.md in order in
# one shell, ```sh tour-background blocks in the background (a second terminal), and
# ```sh tour-wait blocks once the background block has finished. It then checks that the
# tour ended as the README says: a completed deletion, the user's token revoked at Apple,
# and the user.deleted webhook received and verified. Called by scripts/test.sh.
#
# The only change to the README's commands: the demo data goes to a temporary directory
# instead of ./.appleid-broker (so a developer's own demo state is left alone).
set -euo pipefail
cd "$(dirname "$0")/.."
for port in 8080 8090 9000; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "tour: port $port is in use; the tour needs 8080 (broker), 8090 (simulator) and 9000 (receiver)" >&2
    exit 1
  fi
done
work=$(mktemp -d /tmp/appleid-broker-tour.XXXXXX)
chmod a+x "$work"
export BROKER_DATA_DIR="$work/data"
run_pid=
background_pid=
cleanup() {
  [ -n "$background_pid" ] && kill "$background_pid" 2>/dev/null || true
  # TERM, not INT: background jobs of a script ignore SIGINT. run.sh stops the broker and simulator.
  if [ -n "$run_pid" ]; then kill -TERM "$run_pid" 2>/dev/null || true; wait "$run_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

# The README's blocks, by kind, with the data directory substituted.
python3 - "$work" <<'PY'
import re, sys
work = sys.argv[1]
readme = open("README.md").read()
blocks = re.findall(r"^```sh (tour(?:-background|-wait)?)\n(.*?)^```", readme, re.S | re.M)
if len(blocks) < 5:
    sys.exit(f"tour: README.md has only {len(blocks)} tour blocks")
for index, (kind, body) in enumerate(blocks):
    body = body.replace(".appleid-broker/", "$BROKER_DATA_DIR/")
    open(f"{work}/block-{index:02d}-{kind}.sh", "w").write(body)
PY

echo "== make run (scripts/run.sh) in the background; log in $work/run.log" >&2
scripts/run.sh > "$work/run.log" 2>&1 &
run_pid=$!
for _ in $(seq 1 1800); do
  curl -sf -o /dev/null http://127.0.0.1:8080/readyz && break
  kill -0 "$run_pid" 2>/dev/null || { cat "$work/run.log" >&2; echo "tour: make run stopped" >&2; exit 1; }
  sleep 0.5
done
curl -sf -o /dev/null http://127.0.0.1:8080/readyz || { echo "tour: the broker never became ready" >&2; exit 1; }

# One shell runs the foreground blocks, so variables carry from block to block as in a terminal.
script="$work/tour.sh"
echo 'set -euo pipefail' > "$script"
for block in "$work"/block-*.sh; do
  case "$block" in
    *-tour-background.sh)
      cat >> "$script" <<SH
echo "== [second terminal] \$(head -c 120 '$block')" >&2
bash -euo pipefail '$block' > '$work/background.log' 2>&1 &
echo \$! > '$work/background.pid'
for _ in \$(seq 1 100); do grep -q subscribed '$work/background.log' && break; sleep 0.1; done
grep -q subscribed '$work/background.log' || { cat '$work/background.log' >&2; exit 1; }
SH
      ;;
    *-tour-wait.sh)
      cat >> "$script" <<SH
for _ in \$(seq 1 300); do kill -0 \$(cat '$work/background.pid') 2>/dev/null || break; sleep 0.1; done
if kill -0 \$(cat '$work/background.pid') 2>/dev/null; then echo "tour: the webhook receiver never got user.deleted" >&2; exit 1; fi
echo "== $(basename "$block")" >&2
. '$block'
SH
      ;;
    *)
      printf 'echo "== %s" >&2\n. %q\n' "$(basename "$block")" "$block" >> "$script"
      ;;
  esac
done
bash "$script" | tee "$work/tour.out"
background_pid=$(cat "$work/background.pid" 2>/dev/null || true)

echo "== the webhook receiver printed:" >&2
cat "$work/background.log"
failed=0
for topic in user.created email.forwarding_disabled user.deletion_requested user.deleted; do
  grep -q " $topic " "$work/background.log" || { echo "tour: no verified $topic webhook" >&2; failed=1; }
done
grep -q '"state":"done"' "$work/tour.out" || { echo "tour: the deletion is not done" >&2; failed=1; }
grep -q '"outcome":"revoked"' "$work/tour.out" || { echo "tour: no revocation at Apple" >&2; failed=1; }
[ "$failed" = 0 ] && echo "== tour: deletion done, token revoked at Apple, user.deleted webhook delivered and verified" >&2
exit "$failed"
