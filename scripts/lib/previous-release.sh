# The previous release, built beside this checkout (sourced by rolling-upgrade.sh and the
# login benchmark). It is the first `## [x.y.z]` of CHANGELOG.md with its `commit:` line; its
# source is that commit's tree (`git archive`, so nothing is added to the repository's
# worktree list), built with `swift build` in a build directory of its own under
# .build/previous-release/<commit>/, kept between runs: the first build takes several
# minutes, later ones reuse it. The tag vX.Y.Z is created locally when missing (tags may not
# travel with a push).
#   build_previous_release [debug|release]   sets PREVIOUS_VERSION, PREVIOUS_COMMIT, PREVIOUS_BIN
build_previous_release() {
  local configuration=${1:-debug} root version commit previous
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
  previous="$root/.build/previous-release/${commit:0:12}"
  if [ ! -f "$previous/src/Package.swift" ]; then
    rm -rf "$previous/src"
    mkdir -p "$previous/src"
    git -C "$root" archive "$commit" | tar -x -C "$previous/src"
  fi
  echo "== building v$version ($configuration) in ${previous#"$root"/} (its own build directory)" >&2
  swift build -c "$configuration" --package-path "$previous/src" --scratch-path "$previous/build" --product appleid-broker >&2
  PREVIOUS_VERSION=$version
  PREVIOUS_COMMIT=$commit
  PREVIOUS_BIN=$(swift build -c "$configuration" --package-path "$previous/src" --scratch-path "$previous/build" --show-bin-path)
}
