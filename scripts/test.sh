#!/usr/bin/env bash
# Runs every test (what CI runs): builds with warnings as errors, then the stages below in three
# lanes at once, since most stages wait on sockets and PostgreSQL while others keep the cores busy:
#   suites     the Swift suites (database-free and integration), then the live API checks:
#              schemathesis, the deployment checks, the integration examples, the generated client,
#              the rolling upgrade (the previous release built and run beside this one)
#   release    the release build, the README's tour (make run), the resilience suite
#   sanitizers the Swift suites again under ThreadSanitizer, then each fuzz target for a minute
# Each stage's output goes to a log that is printed whole when its lane ends; a table of stage
# times closes the run (docs/testing.md keeps the figures).
# Tests start their own throwaway PostgreSQL clusters and loopback servers.
# Usage: scripts/test.sh [swift test arguments, e.g. --filter JOSETests]  (the Swift suites only)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test

flags=(-Xswiftc -warnings-as-errors)
echo "== build (warnings are errors)" >&2
build_result=$(mktemp)
scripts/lib/stage-time.py "$build_result" swift build --build-tests "${flags[@]}"
read -r _ build_wall build_user build_system < "$build_result"
rm -f "$build_result"
if [ $# -gt 0 ]; then
  exec swift test --skip-build --parallel "$@"
fi

BIN=$(swift build --show-bin-path)
export BROKER_BIN=$BIN NO_COLOR=1
logs=$(mktemp -d "${TMPDIR:-/tmp}/appleid-broker-test.XXXXXX")
trap 'rm -rf "$logs"' EXIT

# timed LANE STAGE COMMAND...: runs one stage into the lane's log and records when it started,
# its wall and CPU seconds (every process of the stage, PostgreSQL included:
# scripts/lib/stage-time.py) and its verdict.
timed() {
  local lane=$1 stage=$2 offset=$((SECONDS - started)) status=0 result
  shift 2
  result=$(mktemp "$logs/result.XXXXXX")
  printf '\n== %s\n' "$stage" >> "$logs/$lane.log"
  scripts/lib/stage-time.py "$result" "$@" >> "$logs/$lane.log" 2>&1 || status=$?
  local wall=? user=? system=?
  read -r _ wall user system < "$result" || true
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$lane" "$stage" "$offset" "$wall" \
    "$(python3 -c "print(round($user + $system))" 2>/dev/null || echo ?)" "$([ $status = 0 ] && echo ok || echo FAILED)" >> "$logs/times"
  return $status
}

# The test binary is run directly, not through `swift test`, which would wait for the release
# lane's build to release SwiftPM's lock on .build.
suites() {
  timed suites "Swift suites" "$BIN/appleid-brokerPackageTests.xctest" --testing-library swift-testing &&
  timed suites "API conformance (schemathesis)" scripts/api-conformance.sh &&
  timed suites "deployment checks" scripts/check-deploy.sh &&
  timed suites "integration examples (Python, Node, Go; standardwebhooks)" scripts/examples.sh &&
  timed suites "generated Python client" scripts/generated-client.sh &&
  timed suites "rolling upgrade (the previous release beside this build on one database)" scripts/rolling-upgrade.sh &&
  timed suites "OpenID Connect relying parties (Authlib, mod_auth_openidc)" scripts/oidc-rps.sh &&
  timed suites "OpenID Foundation conformance plans (Basic, Config, Form Post, RP-Initiated, Back-Channel)" scripts/oidc-conformance.sh
}
release() {
  timed release "release build" swift build -c release --product appleid-broker &&
  timed release "release build (simulator)" swift build -c release --product apple-sim &&
  timed release "the README's tour (make run + its commands)" scripts/tour.sh &&
  timed release "console in Chromium (browser tests)" scripts/console-browser.sh &&
  timed release "resilience (PostgreSQL crashes, broker killed, Apple fails)" env LOAD_SECONDS="${LOAD_SECONDS:-60}" scripts/resilience.sh
}
sanitizers() {
  timed sanitizers "Swift suites under ThreadSanitizer" scripts/test-tsan.sh &&
  timed sanitizers "fuzzing (libFuzzer + AddressSanitizer)" env FUZZ_SECONDS="${FUZZ_SECONDS:-60}" scripts/fuzz.sh
}

started=$SECONDS
read -r _ busy_start < <(awk '/^cpu /{print "x", $2+$3+$4+$7+$8}' /proc/stat)
echo "== lanes: suites, release, sanitizers (each lane's log follows when it ends)" >&2
pids=()
for lane in suites release sanitizers; do
  ( "$lane" ) &
  pids+=("$!")
done
failed=0
for index in "${!pids[@]}"; do
  wait "${pids[$index]}" || failed=1
done
for lane in suites release sanitizers; do
  printf '\n######## lane %s ########\n' "$lane"
  cat "$logs/$lane.log"
done
printf '\n== stage times (seconds; lanes ran at once, %ss in all after a %ss build of %s CPU-seconds)\n' \
  $((SECONDS - started)) "$build_wall" "$(python3 -c "print(round($build_user + $build_system))")"
{ printf 'lane\tstage\tstart\twall\tcpu\tverdict\n'; cat "$logs/times"; } | column -t -s $'\t'
# What the whole machine spent meanwhile (other work on a shared machine makes walls longer).
read -r _ busy_end < <(awk '/^cpu /{print "x", $2+$3+$4+$7+$8}' /proc/stat)
printf 'the machine (%s cores) was busy %s CPU-seconds during the lanes (this run: %s); load average at the end: %s\n' \
  "$(nproc)" $(((busy_end - busy_start) / $(getconf CLK_TCK))) \
  "$(awk -F'\t' '{cpu += $5} END {print cpu}' "$logs/times")" "$(cut -d' ' -f1-3 /proc/loadavg)"
if [ $failed != 0 ]; then
  echo "FAILED:" >&2
  grep -P '\tFAILED$' "$logs/times" >&2
  exit 1
fi
# The closing line CI reads: the Swift suites' count (every other stage passed or we exited above).
passed=$(grep -oP 'Test run with \K[0-9]+(?= tests? in [0-9]+ suites? passed)' "$logs/suites.log" | head -1)
echo "tests: ${passed:-0} passed, 0 failed"
