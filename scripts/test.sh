#!/usr/bin/env bash
# Runs every test (what CI runs). The same commit gives the same result: every stage draws its
# random inputs from a fixed seed and waits on conditions (docs/testing.md, "Determinism").
#
# The stages run in lanes, at once: most of them wait on sockets, PostgreSQL or a browser while
# others keep the two cores busy. A lane runs its stages in order and stops at its first failure;
# `await EVENT` holds a lane until another lane has signalled EVENT (`signal EVENT` after a
# stage that succeeded). The builds that only feed a later lane run at low priority (nice), so
# that the release and ThreadSanitizer builds, which everything else waits for, get the cores first.
# Each stage's output goes to its lane's log, printed whole when the lane ends; a table of stage
# times (start, wall and CPU seconds of every process of the stage) closes the run, and
# docs/testing.md keeps the figures. Add a stage by adding a line to a lane below.
#
# Usage: scripts/test.sh                   every stage (make test)
#        scripts/test.sh [swift test arguments, e.g. --filter JOSETests]   the Swift suites only
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test
python3 scripts/check-imports.py  # every target declares the package modules it imports

# `scripts/test.sh ARGS`: the debug build, warnings are errors, then the suites it names.
if [ $# -gt 0 ]; then
  swift build --build-tests -Xswiftc -warnings-as-errors
  exec swift test --skip-build --parallel "$@"
fi

logs=$(mktemp -d "${TMPDIR:-/tmp}/appleid-broker-test.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$logs"' EXIT
started=$SECONDS
# Two builds of this checkout, not four: the Swift suites run once, in the ThreadSanitizer build
# (a debug build with the sanitizer, warnings are errors), and every stage that starts a broker
# runs the release binaries, the ones `make run` and a deployment run (docs/testing.md, "Two
# builds"). Stages never build in .build themselves.
BIN=$(swift build -c release --show-bin-path)
export BROKER_BIN=$BIN NO_COLOR=1
# The make test budgets of the stages that have a longer version of their own (docs/testing.md).
export FUZZ_RUNS=${FUZZ_RUNS:-100000} LOAD_SECONDS=${LOAD_SECONDS:-30}

# ---- the machinery: timed stages, events between lanes ----

# timed LANE STAGE COMMAND...: runs one stage into the lane's log and records when it started,
# its wall and CPU seconds (every process of the stage, PostgreSQL included:
# scripts/lib/stage-time.py) and its verdict.
timed() {
  local lane=$1 stage=$2 offset=$((SECONDS - started)) status=0 result wall=? user=0 system=0
  shift 2
  result=$(mktemp "$logs/result.XXXXXX")
  printf '\n== %s\n' "$stage" >> "$logs/$lane.log"
  scripts/lib/stage-time.py "$result" "$@" >> "$logs/$lane.log" 2>&1 || status=$?
  read -r _ wall user system < "$result" || true
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$lane" "$stage" "$offset" "$wall" \
    "$(awk -v u="${user:-0}" -v s="${system:-0}" 'BEGIN {printf "%.0f", u + s}')" "$([ $status = 0 ] && echo ok || echo FAILED)" \
    >> "$logs/times"
  return $status
}
# Low priority for a stage that only feeds a later one (a build): it takes what the others leave.
low=(nice -n 10)
# The events, each with the lane that signals it.
declare -A signalled_by=([release-build]=release [python-tools]=tools [previous-release]=fuzz)
signal() { touch "$logs/event.$1"; }
# await EVENT: waits until EVENT is signalled; fails when the lane that signals it ended without it.
await() {
  until [ -e "$logs/event.$1" ]; do
    if [ -e "$logs/ended.${signalled_by[$1]}" ]; then
      echo "await $1: lane ${signalled_by[$1]} ended without it" >> "$logs/$lane.log"
      return 1
    fi
    sleep 1
  done
}

# ---- the lanes ----

# The Python tools (PyPI, pinned): mostly waiting on the network, so at once, beside the builds.
tools() {
  timed tools "Python tools (schemathesis, Selenium, …; openapi-python-client)" \
    bash -c 'source scripts/lib/tools-venv.sh && source scripts/lib/generator-venv.sh' && signal python-tools &&
    timed tools "benchmark report rules (login_report.py: which A/B rounds the goals judge)" \
      python3 -m unittest discover -s scripts/bench -p 'test_*.py'
}
# The Swift suites: the build of every target and test target with ThreadSanitizer (warnings are
# errors), then every suite under it. The longest lane, so it starts at once at full priority.
suites() {
  timed suites "ThreadSanitizer build (every target and test, warnings are errors)" scripts/test-tsan.sh --build-only &&
  timed suites "Swift suites under ThreadSanitizer" scripts/test-tsan.sh
}
# The release binaries, and what runs them the way a user does: make run and the README's tour,
# the console in a browser, resilience.
release() {
  timed release "release build (broker, simulator)" \
    bash -c 'swift build -c release --product appleid-broker && swift build -c release --product apple-sim' &&
  signal release-build &&
  timed release "the README's tour (make run + its commands)" scripts/tour.sh &&
  await python-tools &&
  timed release "console in Chromium (browser tests)" scripts/console-browser.sh &&
  timed release "resilience (PostgreSQL crashes, broker killed, Apple fails; ${LOAD_SECONDS}s of load)" scripts/resilience.sh
}
# Independent clients and peers against a live (release) broker.
http() {
  await release-build && await python-tools &&
  timed http "API conformance (pinned cases, schemathesis with a fixed seed)" scripts/api-conformance.sh &&
  timed http "deployment checks" scripts/check-deploy.sh &&
  timed http "integration examples (Python, Node, Go; standardwebhooks)" scripts/examples.sh &&
  timed http "generated Python client" scripts/generated-client.sh &&
  timed http "OpenID Connect relying parties (Authlib, mod_auth_openidc)" scripts/oidc-rps.sh &&
  await previous-release &&
  timed http "rolling upgrade (the previous release beside this build on one database)" scripts/rolling-upgrade.sh
}
# libFuzzer (fixed seed and runs) and the previous release's build, both only feeding themselves or a later
# stage, at low priority; then the OpenID Foundation's plans and the single-page app, stages that fit here.
fuzz() {
  timed fuzz "fuzzing (libFuzzer + AddressSanitizer, ${FUZZ_RUNS} inputs per target from a fixed seed; builds included)" \
    "${low[@]}" scripts/fuzz.sh &&
  timed fuzz "previous release build (for the rolling upgrade)" "${low[@]}" scripts/rolling-upgrade.sh --build-only &&
  signal previous-release &&
  await release-build && await python-tools &&
  timed fuzz "OpenID Foundation conformance plans (Basic, Config, Form Post, RP-Initiated, Back-Channel)" scripts/oidc-conformance.sh &&
  timed fuzz "single-page sign-in through the provider in Chromium (PKCE, CORS, prompt=none renewal)" scripts/oidc-spa-browser.sh
}
lanes=(tools suites release http fuzz)

# ---- run ----

read -r _ busy_start < <(awk '/^cpu /{print "x", $2+$3+$4+$7+$8}' /proc/stat)
echo "== lanes: ${lanes[*]} (each lane's log follows when it ends)" >&2
pids=()
for lane in "${lanes[@]}"; do
  ( status=0; "$lane" || status=$?; touch "$logs/ended.$lane"; exit $status ) &
  pids+=("$!")
done
failed=0
for index in "${!pids[@]}"; do
  wait "${pids[$index]}" || failed=1
done
for lane in "${lanes[@]}"; do
  printf '\n######## lane %s ########\n' "$lane"
  cat "$logs/$lane.log"
done
# What the whole machine spent meanwhile (other work on a shared machine makes walls longer).
read -r _ busy_end < <(awk '/^cpu /{print "x", $2+$3+$4+$7+$8}' /proc/stat)
printf '\n== stage times (seconds from the start; CPU of every process of the stage)\n'
{ printf 'lane\tstage\tstart\twall\tcpu\tverdict\n'; sort -t$'\t' -k3,3n "$logs/times"; } | column -t -s $'\t'
printf '%ss in all; the stages used %s CPU-seconds, the machine (%s cores) %s; load average at the end: %s\n' \
  $((SECONDS - started)) "$(awk -F'\t' '{cpu += $5} END {print cpu}' "$logs/times")" "$(nproc)" \
  $(((busy_end - busy_start) / $(getconf CLK_TCK))) "$(cut -d' ' -f1-3 /proc/loadavg)"
if [ $failed != 0 ]; then
  echo "FAILED:" >&2
  grep -P '\tFAILED$' "$logs/times" >&2 || echo "(a lane ended early: see its log)" >&2
  exit 1
fi
# The closing line CI reads: the Swift suites' count (every other stage passed or we exited above).
passed=$(grep -oP 'Test run with \K[0-9]+(?= tests? in [0-9]+ suites? passed)' "$logs/suites.log" | head -1)
echo "tests: ${passed:-0} passed, 0 failed"
