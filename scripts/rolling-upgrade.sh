#!/usr/bin/env bash
# A rolling upgrade, for real: the previous release (the first `## [x.y.z]` of CHANGELOG.md
# and its `commit:`) and this checkout's build, side by side on one database, both driven
# and checked by scripts/rolling-upgrade.py (see there for what is checked).
#
#   scripts/rolling-upgrade.sh [--write-catalog]   (--write-catalog: rewrite sql/catalog/expected.txt)
#   scripts/rolling-upgrade.sh --build-only        (builds the previous release and stops: make test
#                                                   builds it early, beside its other builds)
#
# The previous release is built once per machine (scripts/lib/previous-release.sh says where).
# Needs PostgreSQL's server binaries and psql.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/opt/swift/usr/bin:$PATH

# shellcheck source=lib/previous-release.sh
source scripts/lib/previous-release.sh
build_previous_release debug
[ "${1:-}" = --build-only ] && exit 0
echo "== previous release v$PREVIOUS_VERSION ($PREVIOUS_COMMIT)" >&2
# make test hands over the binaries it built (BROKER_BIN), so this does not wait for SwiftPM's
# lock on .build while another stage builds there.
if [ -z "${BROKER_BIN:-}" ]; then
  echo "== building this checkout" >&2
  swift build --product appleid-broker >&2
  swift build --product apple-sim >&2
fi

arguments=(--previous "$PREVIOUS_BIN"
           --current "${BROKER_BIN:-$(swift build --show-bin-path)}")
[ "${1:-}" = "--write-catalog" ] && arguments+=(--write-catalog sql/catalog/expected.txt)
exec python3 scripts/rolling-upgrade.py "${arguments[@]}"
