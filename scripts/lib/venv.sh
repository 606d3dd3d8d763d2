# cached_venv VAR NAME REQUIREMENT... [-- NO_DEPS_REQUIREMENT...]: a Python virtual environment
# with REQUIREMENTs (PyPI) at the exact versions scripts/lib/python-constraints.txt names, and the
# NO_DEPS_REQUIREMENTs installed without their dependencies; installed once per machine under a
# key of those (scripts/lib/cache.sh), a lock keeping two runs from installing it at once. Sets
# VAR to its path. Sourced by generator-venv.sh and tools-venv.sh.
venv_lib="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=cache.sh
source "$venv_lib/cache.sh"

cached_venv() {
  local var=$1 name=$2
  shift 2
  local requirements=() without_dependencies=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do requirements+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  without_dependencies=("$@")
  local wanted="${requirements[*]}${without_dependencies[*]:+ ${without_dependencies[*]}}"
  local key
  key=$( { echo "$wanted"; python3 --version; cat "$venv_lib/python-constraints.txt"; } | sha256sum | cut -c1-16)
  local venv="$APPLEID_BROKER_CACHE/venvs/$name-$key"
  if [ ! -f "$venv/.installed" ]; then
    mkdir -p "$APPLEID_BROKER_CACHE/venvs"
    (
      flock 9
      if [ ! -f "$venv/.installed" ]; then
        echo "== installing $wanted into $venv" >&2
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -c "$venv_lib/python-constraints.txt" "${requirements[@]}"
        if [ ${#without_dependencies[@]} -gt 0 ]; then
          "$venv/bin/pip" install --quiet --disable-pip-version-check -c "$venv_lib/python-constraints.txt" --no-deps \
            "${without_dependencies[@]}"
        fi
        touch "$venv/.installed"
      fi
    ) 9> "$venv.lock"
  fi
  printf -v "$var" '%s' "$venv"
}
