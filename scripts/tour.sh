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
# The README's ports (broker 8080, simulator 8090, receiver 9000) when they are free; when any
# is taken (`make run` in another terminal, another test run) the tour picks free ones and runs
# the README's commands with those ports, printed as it runs them.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# shellcheck source=lib/ports.sh
source scripts/lib/ports.sh
broker_port=8080 sim_port=8090 receiver_port=9000
if port_in_use 8080 || port_in_use 8090 || port_in_use 9000; then
  broker_port=$(free_port) sim_port=$(free_port) receiver_port=$(free_port)
  echo "tour: 8080/8090/9000 are in use; running on broker $broker_port, simulator $sim_port, receiver $receiver_port" >&2
fi
export BROKER_LISTEN=127.0.0.1:$broker_port APPLE_SIM_LISTEN=127.0.0.1:$sim_port
export TOUR_BROKER_PORT=$broker_port TOUR_SIM_PORT=$sim_port TOUR_RECEIVER_PORT=$receiver_port
work=$(mktemp -d /tmp/appleid-broker-tour.XXXXXX)
chmod a+x "$work"
export BROKER_DATA_DIR="$work/data"
run_pid=
background_pid=
cleanup() {
  [ -n "$background_pid" ] && kill "$background_pid" 2>/dev/null || true
  # TERM, not INT: background jobs of a script ignore SIGINT. run.sh stops the broker and simulator.
  if [ -n "$run_pid" ]; then kill -TERM "$run_pid" 2>/dev/null || true; wait "$run_pid" 2>/dev/null || true; fi
  # Nothing of the tour's may outlive it: the embedded PostgreSQL stops with the broker.
  local pidfile="$work/data/postgres/postmaster.pid" postmaster
  postmaster=$(head -1 "$pidfile" 2>/dev/null || true)
  if [ -n "$postmaster" ] && kill -0 "$postmaster" 2>/dev/null; then
    echo "tour: the embedded PostgreSQL (pid $postmaster) is still running after make run stopped; run.log ends:" >&2
    tail -5 "$work/run.log" >&2
    kill -TERM "$postmaster" 2>/dev/null || true
    exit 1
  fi
}
trap cleanup EXIT

# The README's blocks, by kind, with the data directory substituted.
python3 - "$work" <<'PY'
import os, re, sys
work = sys.argv[1]
readme = open("README.md").read()
blocks = re.findall(r"^```sh (tour(?:-background|-wait)?)\n(.*?)^```", readme, re.S | re.M)
if len(blocks) < 5:
    sys.exit(f"tour: README.md has only {len(blocks)} tour blocks")
for index, (kind, body) in enumerate(blocks):
    body = body.replace(".appleid-broker/", "$BROKER_DATA_DIR/")
    # The ports the tour runs on (the README's unless they were taken).
    body = body.replace("127.0.0.1:8080", "127.0.0.1:" + os.environ["TOUR_BROKER_PORT"])
    body = body.replace("--port 9000", "--port " + os.environ["TOUR_RECEIVER_PORT"])
    if os.environ["TOUR_SIM_PORT"] != "8090":
        body = body.replace("127.0.0.1:8090", "127.0.0.1:" + os.environ["TOUR_SIM_PORT"])
        body = re.sub(r"^(SIM=\S+)$", r"\1\nexport APPLE_SIM_URL=http://127.0.0.1:" + os.environ["TOUR_SIM_PORT"], body, flags=re.M)
    open(f"{work}/block-{index:02d}-{kind}.sh", "w").write(body)
PY

echo "== make run (scripts/run.sh) in the background; log in $work/run.log" >&2
scripts/run.sh > "$work/run.log" 2>&1 &
run_pid=$!
for _ in $(seq 1 1800); do
  curl -sf -o /dev/null "http://$BROKER_LISTEN/readyz" && break
  kill -0 "$run_pid" 2>/dev/null || { cat "$work/run.log" >&2; echo "tour: make run stopped" >&2; exit 1; }
  sleep 0.5
done
curl -sf -o /dev/null "http://$BROKER_LISTEN/readyz" || { echo "tour: the broker never became ready" >&2; exit 1; }

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
# Conditions, not a count of tries: a loaded machine takes longer, never fails for it (120 s).
deadline=\$((SECONDS + 120))
until grep -q subscribed '$work/background.log' || [ \$SECONDS -ge \$deadline ]; do sleep 0.1; done
grep -q subscribed '$work/background.log' || { cat '$work/background.log' >&2; exit 1; }
SH
      ;;
    *-tour-wait.sh)
      cat >> "$script" <<SH
deadline=\$((SECONDS + 120))
while kill -0 \$(cat '$work/background.pid') 2>/dev/null && [ \$SECONDS -lt \$deadline ]; do sleep 0.1; done
if kill -0 \$(cat '$work/background.pid') 2>/dev/null; then echo "tour: the webhook receiver never got user.deleted" >&2; exit 1; fi
echo "== $(basename "$block")" >&2
sed "s/^/    /" '$block' >&2
. '$block'
SH
      ;;
    *)
      printf 'echo "== %s" >&2\nsed "s/^/    /" %q >&2\n. %q\n' "$(basename "$block")" "$block" "$block" >> "$script"
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
