#!/usr/bin/env bash
# The Swift test suite under ThreadSanitizer. BROKER_TSAN=1 makes `Lock` (Sources/Locking) a
# pthread mutex (PThreadMutex says why); the build goes to .build/tsan.
# Any report fails the run (TSAN_OPTIONS halt_on_error).  [swift test args] scripts/test-tsan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test
export BROKER_TSAN=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
echo "== build with -sanitize=thread" >&2
swift build --build-tests --sanitize=thread --build-path .build/tsan
echo "== test under ThreadSanitizer" >&2
swift test --skip-build --sanitize=thread --build-path .build/tsan "$@"
