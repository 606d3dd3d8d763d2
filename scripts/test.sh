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
# deployment files against the code, and runs the README's tour.
if [ $# -eq 0 ]; then
  echo "== API conformance (schemathesis)" >&2
  scripts/api-conformance.sh
  scripts/check-deploy.sh
  echo "== the README's tour, as a newcomer runs it (make run + its commands)" >&2
  scripts/tour.sh
fi
