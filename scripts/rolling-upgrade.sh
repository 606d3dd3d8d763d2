#!/usr/bin/env bash
# A rolling upgrade, for real: the previous release (the first `## [x.y.z]` of CHANGELOG.md
# and its `commit:`) and this checkout's build, side by side on one database, both driven
# and checked by scripts/rolling-upgrade.py (see there for what is checked).
#
#   scripts/rolling-upgrade.sh [--write-catalog]   (--write-catalog: rewrite sql/catalog/expected.txt)
#
# The previous release's source is the commit's tree (`git archive`, so nothing is added to
# the repository's worktree list), built with `swift build` in a build directory of its own
# under .build/previous-release/<commit>/, kept between runs: the first run builds it from
# scratch (several minutes), later runs reuse it. The tag vX.Y.Z is created locally when
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

previous=".build/previous-release/${commit:0:12}"
if [ ! -f "$previous/src/Package.swift" ]; then
  rm -rf "$previous/src"
  mkdir -p "$previous/src"
  git archive "$commit" | tar -x -C "$previous/src"
fi
echo "== building v$version in $previous (its own build directory)" >&2
swift build --package-path "$previous/src" --scratch-path "$previous/build" --product appleid-broker >&2
echo "== building this checkout" >&2
swift build --product appleid-broker >&2
swift build --product apple-sim >&2

arguments=(--previous "$(swift build --package-path "$previous/src" --scratch-path "$previous/build" --show-bin-path)"
           --current "$(swift build --show-bin-path)")
[ "${1:-}" = "--write-catalog" ] && arguments+=(--write-catalog sql/catalog/expected.txt)
exec python3 scripts/rolling-upgrade.py "${arguments[@]}"
