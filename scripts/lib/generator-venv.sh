# A Python virtual environment with openapi-python-client (PyPI), the generator
# scripts/generated-client.sh runs, at the exact versions scripts/lib/python-constraints.txt
# names; installed once per machine under that key (scripts/lib/cache.sh). Nothing is installed
# into it afterwards (the generated client goes to a directory of the run's own).
# Sourced; sets GENERATOR_VENV.
generator_lib="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=cache.sh
source "$generator_lib/cache.sh"
generator_requirement="openapi-python-client>=0.21,<1"
generator_key=$( { echo "$generator_requirement"; python3 --version; cat "$generator_lib/python-constraints.txt"; } | sha256sum | cut -c1-16)
GENERATOR_VENV="$APPLEID_BROKER_CACHE/venvs/generator-$generator_key"
if [ ! -f "$GENERATOR_VENV/.installed" ]; then
  mkdir -p "$APPLEID_BROKER_CACHE/venvs"
  (
    flock 9
    if [ ! -f "$GENERATOR_VENV/.installed" ]; then
      echo "== installing $generator_requirement into $GENERATOR_VENV" >&2
      rm -rf "$GENERATOR_VENV"
      python3 -m venv "$GENERATOR_VENV"
      "$GENERATOR_VENV/bin/pip" install --quiet --disable-pip-version-check -c "$generator_lib/python-constraints.txt" \
        "$generator_requirement"
      touch "$GENERATOR_VENV/.installed"
    fi
  ) 9> "$GENERATOR_VENV.lock"
fi
