#!/usr/bin/env bash
# The Swift test suite under ThreadSanitizer; the build goes to .build/tsan. It sees every lock:
# `Lock` (Sources/Locking) is a pthread mutex, which the sanitizer intercepts.
# Any report fails the run (TSAN_OPTIONS halt_on_error). Warnings are errors: in make test this is
# the one build of the test targets (docs/testing.md says why).
#   scripts/test-tsan.sh [swift test arguments]   builds, then runs the suites
#   scripts/test-tsan.sh --build-only             builds (make test builds first, at low priority)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
echo "== build with -sanitize=thread" >&2
swift build --build-tests --sanitize=thread --build-path .build/tsan -Xswiftc -warnings-as-errors
[ "${1:-}" = --build-only ] && exit 0
echo "== test under ThreadSanitizer" >&2
swift test --skip-build --sanitize=thread --build-path .build/tsan "$@"
