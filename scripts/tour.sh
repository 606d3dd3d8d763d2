#!/usr/bin/env bash
# Runs the README's 5-minute tour exactly as written, the way a newcomer would: `make run`
# (scripts/run.sh) in the background, then every ```sh tour block of README.md in order in
# one shell, ```sh tour-background blocks in the background (a second terminal), and
# ```sh tour-wait blocks once the background block has finished. It then checks that the
# tour ended as the README says: a completed deletion, the user's token revoked at Apple,
# the user.deleted webhook received and verified, a website signed in through the OpenID
# Provider and logged out by Apple's consent-revoked (Back-Channel Logout), and the console's
# pages opened with a sign-in link. Last, it stops `make run` as a person does, Ctrl-C, then
# starts it again and closes its "terminal" (SIGHUP to its process group), and each time
# checks that nothing of it is left: no process, no PostgreSQL, no port. Called by
# scripts/test.sh.
#
# The only change to the README's commands: the demo data goes to a temporary directory
# instead of ./.appleid-broker (so a developer's own demo state is left alone).
set -euo pipefail
cd "$(dirname "$0")/.."
# The README's ports (broker 8080, simulator 8090, console 8081, webhook receiver 9000, the
# website's 9001) when they are free; when any is taken (`make run` in another terminal,
# another test run) the tour picks free ones and runs the README's commands with those ports,
# printed as it runs them.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# shellcheck source=lib/ports.sh
source scripts/lib/ports.sh
# shellcheck source=lib/wait.sh
source scripts/lib/wait.sh
broker_port=8080 sim_port=8090 console_port=8081 receiver_port=9000 website_port=9001
if port_in_use 8080 || port_in_use 8090 || port_in_use 8081 || port_in_use 9000 || port_in_use 9001; then
  broker_port=$(free_port) sim_port=$(free_port) console_port=$(free_port) receiver_port=$(free_port)
  website_port=$(free_port)
  echo "tour: 8080/8090/8081/9000/9001 are in use; running on broker $broker_port, simulator $sim_port," \
    "console $console_port, receiver $receiver_port, website $website_port" >&2
fi
export BROKER_LISTEN=127.0.0.1:$broker_port APPLE_SIM_LISTEN=127.0.0.1:$sim_port
export BROKER_CONSOLE_LISTEN=127.0.0.1:$console_port
export TOUR_BROKER_PORT=$broker_port TOUR_SIM_PORT=$sim_port TOUR_RECEIVER_PORT=$receiver_port
export TOUR_CONSOLE_PORT=$console_port TOUR_WEBSITE_PORT=$website_port
work=$(mktemp -d /tmp/appleid-broker-tour.XXXXXX)
chmod a+x "$work"
export BROKER_DATA_DIR="$work/data"
run_pid=
background_pid=

# `make run` as in a terminal: a process group of its own (job control), so that the tour can
# signal it as a terminal does: SIGINT to the whole group for Ctrl-C, SIGHUP when it closes.
start_make_run() {
  echo "== make run (scripts/run.sh) in the background; log in $work/run.log" >&2
  set -m
  scripts/run.sh >> "$work/run.log" 2>&1 &
  run_pid=$!
  set +m
  # A deadline, not a count of tries: a first make run builds, runs initdb and the migrations.
  local deadline=$((SECONDS + 900))
  while [ $SECONDS -lt $deadline ]; do
    curl -sf -m 5 -o /dev/null "http://$BROKER_LISTEN/readyz" && port_in_use "$console_port" && return 0
    kill -0 "$run_pid" 2>/dev/null || { cat "$work/run.log" >&2; echo "tour: make run stopped" >&2; exit 1; }
    sleep 0.5
  done
  echo "tour: the broker (or its console) never became ready" >&2
  exit 1
}

# What is left of make run: its process group, any process naming the tour's data (the
# embedded PostgreSQL and its watchdog), a listening port of the broker, console or simulator.
leftovers() {
  local group=$1 port
  pgrep -g "$group" -a 2>/dev/null || true
  pgrep -f "$work/data" -a 2>/dev/null || true
  for port in "$broker_port" "$console_port" "$sim_port"; do
    if port_in_use "$port"; then echo "port $port still listening"; fi
  done
}

# exited PID: PID is gone, or a zombie this shell has yet to reap.
exited() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 0
  [ "${state:0:1}" = Z ]
}

# Stops make run with signal $1 sent to its process group; fails unless it ends within 60 s and
# nothing is left of it within 60 s more (the embedded PostgreSQL stops a moment after its last
# user, by its watchdog).
stop_make_run() {
  local signal=$1 what=$2 group=$run_pid left="" ignored=""
  echo "== stopping make run: $what (SIG$signal to its process group)" >&2
  kill -"$signal" -- -"$group" 2>/dev/null || true
  # A deadline before the shell's `wait`, which has none: a make run that ignored the signal
  # fails the tour after 60 s instead of holding make test until CI's limit.
  if ! wait_until 60 exited "$run_pid"; then
    echo "tour: make run was still running 60 s after SIG$signal" >&2
    kill -KILL -- -"$group" 2>/dev/null || true
    ignored=1
  fi
  wait "$run_pid" 2>/dev/null || true
  run_pid=
  wait_until 60 eval 'left=$(leftovers "$group"); [ -z "$left" ]' || true
  if [ -n "$ignored" ]; then return 1; fi
  if [ -n "$left" ]; then
    echo "tour: after $what, still there:" >&2
    echo "$left" >&2
    tail -5 "$work/run.log" >&2
    kill -KILL -- -"$group" 2>/dev/null || true
    return 1
  fi
  echo "== $what stopped everything: no process of make run, no PostgreSQL, no port left" >&2
}

cleanup() {
  local status=$?
  [ -n "$background_pid" ] && kill "$background_pid" 2>/dev/null || true
  # Nothing of the tour's may outlive it, on failure too.
  if [ -n "$run_pid" ]; then stop_make_run TERM "the tour's cleanup" || status=1; fi
  # A failed tour keeps its directory (logs, blocks, data) for a look; a passed one leaves none.
  if [ "$status" = 0 ]; then rm -rf "$work"; else echo "tour: its files are in $work" >&2; fi
  exit "$status"
}
trap cleanup EXIT

# The README's blocks, by kind, with the data directory substituted.
python3 - "$work" <<'PY'
import os, re, sys
work = sys.argv[1]
readme = open("README.md").read()
blocks = re.findall(r"^```sh (tour(?:-background|-wait)?)\n(.*?)^```", readme, re.S | re.M)
if len(blocks) < 8:
    sys.exit(f"tour: README.md has only {len(blocks)} tour blocks")
for index, (kind, body) in enumerate(blocks):
    body = body.replace(".appleid-broker/", "$BROKER_DATA_DIR/")
    # The ports the tour runs on (the README's unless they were taken).
    body = body.replace("127.0.0.1:8080", "127.0.0.1:" + os.environ["TOUR_BROKER_PORT"])
    body = body.replace("--port 9000", "--port " + os.environ["TOUR_RECEIVER_PORT"])
    body = body.replace("127.0.0.1:8081", "127.0.0.1:" + os.environ["TOUR_CONSOLE_PORT"])
    body = body.replace("127.0.0.1:9001", "127.0.0.1:" + os.environ["TOUR_WEBSITE_PORT"])
    if os.environ["TOUR_SIM_PORT"] != "8090":
        body = body.replace("127.0.0.1:8090", "127.0.0.1:" + os.environ["TOUR_SIM_PORT"])
        body = re.sub(r"^(SIM=\S+)$", r"\1\nexport APPLE_SIM_URL=http://127.0.0.1:" + os.environ["TOUR_SIM_PORT"], body, flags=re.M)
    open(f"{work}/block-{index:02d}-{kind}.sh", "w").write(body)
PY

start_make_run
# What make run prints once ready: the provider's discovery URL, the registration command, a link.
wait_until 60 grep -q 'console link --operator demo' "$work/run.log" || true
for printed in "/oidc/.well-known/openid-configuration" "/oidc/register" "127.0.0.1:$console_port/link?token=" \
  "console link --operator demo --role viewer,operator,compliance,admin"; do
  grep -qF "$printed" "$work/run.log" || { echo "tour: make run did not print $printed" >&2; exit 1; }
done

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
grep -q 'logout_token verified' "$work/tour.out" || { echo "tour: the website got no Back-Channel Logout" >&2; failed=1; }
[ "$(grep -c '^console page: ' "$work/tour.out")" = 3 ] || { echo "tour: the console's pages did not all answer" >&2; failed=1; }
[ "$failed" = 0 ] || exit 1
echo "== tour: deletion done, token revoked at Apple, user.deleted webhook delivered and verified;" \
  "a website signed in through the provider and logged out by Apple's consent-revoked; the console's pages answered" >&2

# Stopping make run stops everything it started: Ctrl-C, then (started again) a closed terminal.
stop_make_run INT "Ctrl-C"
start_make_run
stop_make_run HUP "a closed terminal"
