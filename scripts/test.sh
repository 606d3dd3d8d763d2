#!/usr/bin/env bash
# Runs every test: builds with warnings as errors, then the whole suite in parallel.
# Tests start their own throwaway PostgreSQL clusters and loopback servers.
# Usage: scripts/test.sh [swift test arguments, e.g. --filter JOSETests]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test

flags=(-Xswiftc -warnings-as-errors)
echo "== build (warnings are errors)" >&2
swift build --build-tests "${flags[@]}"
echo "== test" >&2
swift test --skip-build --parallel "$@"

# The whole suite (no filter given) also checks the live API against its description, the
# deployment files against the code, runs the README's tour, the integration examples, the resilience suite, each
# fuzz target for a minute, and the Swift suite again under ThreadSanitizer.
if [ $# -eq 0 ]; then
  echo "== API conformance (schemathesis)" >&2
  scripts/api-conformance.sh
  scripts/check-deploy.sh
  echo "== the README's tour, as a newcomer runs it (make run + its commands)" >&2
  scripts/tour.sh
  echo "== integration examples (Python, Node, Go) against a live broker; official standardwebhooks check" >&2
  scripts/examples.sh
  echo "== a Python client generated from docs/openapi.json (openapi-python-client): login and user read" >&2
  scripts/generated-client.sh
  echo "== resilience: load while PostgreSQL crashes, the broker is killed, Apple fails, a receiver is down" >&2
  LOAD_SECONDS=${LOAD_SECONDS:-60} scripts/resilience.sh
  echo "== fuzzing (libFuzzer + AddressSanitizer)" >&2
  FUZZ_SECONDS=${FUZZ_SECONDS:-60} scripts/fuzz.sh
  echo "== the Swift suite under ThreadSanitizer" >&2
  scripts/test-tsan.sh
fi
