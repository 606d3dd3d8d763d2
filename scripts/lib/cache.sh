# The machine's cache of what the checks install or build from inputs that never change under a
# given key, shared by every clone on the machine like the Debian packages bootstrap.sh installs:
# the Python tools (keyed by scripts/lib/python-constraints.txt) and the previous release's build
# (keyed by its commit). APPLEID_BROKER_CACHE moves it (default ~/.cache/appleid-broker); removing
# it makes the next run install and build them again. Sourced; sets APPLEID_BROKER_CACHE.
APPLEID_BROKER_CACHE=${APPLEID_BROKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/appleid-broker}
mkdir -p "$APPLEID_BROKER_CACHE"
