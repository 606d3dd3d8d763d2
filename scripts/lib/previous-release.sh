# The previous release, built beside this checkout (sourced by rolling-upgrade.sh and the
# login benchmark). It is the first `## [x.y.z]` of CHANGELOG.md with its `commit:` line; its
# source is that commit's tree (`git archive`, so nothing is added to the repository's
# worktree list), built with `swift build` in a build directory of its own in the machine's
# cache (scripts/lib/cache.sh: ~/.cache/appleid-broker/previous-release/<commit>/), kept between
# runs and clones: a release's sources never change, and a real rolling upgrade runs the released
# binary, not a rebuild of it. The first build on a machine takes several minutes, later ones
# reuse it (SwiftPM locks the build directory against two at once). No index store: nothing
# reads it here, and writing it costs a fifth of a build. The tag vX.Y.Z is created locally when
# missing (tags may not travel with a push).
#   build_previous_release [debug|release]   sets PREVIOUS_VERSION, PREVIOUS_COMMIT, PREVIOUS_BIN
build_previous_release() {
  local configuration=${1:-debug} root version commit previous unpacked
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  read -r version commit < <(python3 - "$root/CHANGELOG.md" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
match = re.search(r"^## \[(\d+\.\d+\.\d+)\][^\n]*\n+commit: ([0-9a-f]{7,40})\s*$", text, re.M)
if not match:
    sys.exit("CHANGELOG.md names no released version with its commit")
print(match.group(1), match.group(2))
PY
  )
  commit=$(git -C "$root" rev-parse --verify "$commit^{commit}")
  git -C "$root" rev-parse -q --verify "refs/tags/v$version" >/dev/null || git -C "$root" tag "v$version" "$commit"
  # shellcheck source=cache.sh
  source "$root/scripts/lib/cache.sh"
  previous="$APPLEID_BROKER_CACHE/previous-release/${commit:0:12}"
  if [ ! -f "$previous/src/Package.swift" ]; then
    mkdir -p "$previous"
    unpacked=$(mktemp -d "$previous/src.XXXXXX")
    git -C "$root" archive "$commit" | tar -x -C "$unpacked"
    # Another run on this machine may have placed it meanwhile: theirs is the same tree.
    mv -T "$unpacked" "$previous/src" 2>/dev/null || rm -rf "$unpacked"
  fi
  echo "== building v$version ($configuration) in $previous (its own build directory)" >&2
  swift build -c "$configuration" --package-path "$previous/src" --scratch-path "$previous/build" --product appleid-broker \
    --disable-index-store >&2
  PREVIOUS_VERSION=$version
  PREVIOUS_COMMIT=$commit
  PREVIOUS_BIN=$(swift build -c "$configuration" --package-path "$previous/src" --scratch-path "$previous/build" --show-bin-path)
}
