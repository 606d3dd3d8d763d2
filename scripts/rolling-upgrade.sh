#!/usr/bin/env bash
# A rolling upgrade, for real: the previous release (the first `## [x.y.z]` of CHANGELOG.md
# and its `commit:`) and this checkout's build, side by side on one database, both driven
# and checked by scripts/rolling-upgrade.py (see there for what is checked).
#
#   scripts/rolling-upgrade.sh [--write-catalog]   (--write-catalog: rewrite sql/catalog/expected.txt)
#   scripts/rolling-upgrade.sh --build-only        (builds the previous release and stops: make test
#                                                   builds it early, beside its other builds)
#
# The previous release's source is the commit's tree (`git archive`, so nothing is added to
# the repository's worktree list), built with `swift build` in a build directory of its own
# in the machine's cache (scripts/lib/cache.sh: ~/.cache/appleid-broker/previous-release/<commit>/),
# kept between runs and clones: the first run on a machine builds it from scratch (about 40
# CPU-seconds), later ones reuse it (SwiftPM locks the build directory against two at once). The tag vX.Y.Z is created locally when
# missing (tags may not travel with a push). Needs PostgreSQL's server binaries and psql.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/opt/swift/usr/bin:$PATH

read -r version commit < <(python3 - <<'PY'
import re, sys
text = open("CHANGELOG.md").read()
match = re.search(r"^## \[(\d+\.\d+\.\d+)\][^\n]*\n+commit: ([0-9a-f]{7,40})\s*$", text, re.M)
if not match:
    sys.exit("rolling-upgrade: CHANGELOG.md names no released version with its commit")
print(match.group(1), match.group(2))
PY
)
commit=$(git rev-parse --verify "$commit^{commit}")
git rev-parse -q --verify "refs/tags/v$version" >/dev/null || git tag "v$version" "$commit"
echo "== previous release v$version ($commit)" >&2

# Built once per machine (scripts/lib/cache.sh): a release's sources never change, and a real
# rolling upgrade runs the released binary, not a rebuild of it.
# shellcheck source=lib/cache.sh
source scripts/lib/cache.sh
previous="$APPLEID_BROKER_CACHE/previous-release/${commit:0:12}"
if [ ! -f "$previous/src/Package.swift" ]; then
  mkdir -p "$previous"
  unpacked=$(mktemp -d "$previous/src.XXXXXX")
  git archive "$commit" | tar -x -C "$unpacked"
  # Another run on this machine may have placed it meanwhile: theirs is the same tree.
  mv -T "$unpacked" "$previous/src" 2>/dev/null || rm -rf "$unpacked"
fi
echo "== building v$version in $previous (its own build directory)" >&2
# No index store: nothing reads it here (no tests to discover), and writing it costs a fifth of a build.
swift build --package-path "$previous/src" --scratch-path "$previous/build" --product appleid-broker --disable-index-store >&2
[ "${1:-}" = --build-only ] && exit 0
# make test hands over the binaries it built (BROKER_BIN), so this does not wait for SwiftPM's
# lock on .build while another stage builds there.
if [ -z "${BROKER_BIN:-}" ]; then
  echo "== building this checkout" >&2
  swift build --product appleid-broker >&2
  swift build --product apple-sim >&2
fi

arguments=(--previous "$(swift build --package-path "$previous/src" --scratch-path "$previous/build" --show-bin-path)"
           --current "${BROKER_BIN:-$(swift build --show-bin-path)}")
[ "${1:-}" = "--write-catalog" ] && arguments+=(--write-catalog sql/catalog/expected.txt)
exec python3 scripts/rolling-upgrade.py "${arguments[@]}"
