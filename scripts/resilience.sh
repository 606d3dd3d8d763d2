#!/usr/bin/env bash
# make resilience: builds the release binaries and runs scripts/resilience.py (mixed load,
# PostgreSQL crash, two broker SIGKILLs, a failing simulator, a receiver down; then the
# invariants). Exits non-zero if any invariant fails. [LOAD_SECONDS=75] scripts/resilience.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LOAD_SECONDS:=75}"
scripts/bootstrap.sh test
swift build -c release --product appleid-broker >&2
swift build -c release --product apple-sim >&2
exec python3 scripts/resilience.py --bin "$(swift build -c release --show-bin-path)" --load-seconds "$LOAD_SECONDS"
