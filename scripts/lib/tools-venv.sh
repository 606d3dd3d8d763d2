# A Python virtual environment with the PyPI tools the checks use (schemathesis,
# kubernetes-validate, PyYAML, standardwebhooks for the examples' deliveries; matplotlib for the
# benchmark chart only; Authlib and requests for the OpenID Connect relying parties of
# scripts/oidc-rps.sh and the OIDC benchmark, with Django, mozilla-django-oidc and
# django-allauth for its two Django relying parties; selenium, pytest and cryptography for the console's
# browser tests, with axe-playwright-python as the source of axe.min.js only: installed without
# its dependencies, since Playwright and its browser download are not used).
# Every package at the exact version scripts/lib/python-constraints.txt names, so the same commit
# runs the same tools; installed once per machine under that key (scripts/lib/cache.sh), a lock
# keeping two runs from installing it at once. Sourced; sets TOOLS_VENV.
tools_lib="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=cache.sh
source "$tools_lib/cache.sh"
tools_requirements=("schemathesis>=4.1,<5" "kubernetes-validate>=1.30" "PyYAML>=6" "matplotlib>=3.8" "standardwebhooks>=1.1"
  "selenium>=4.20,<5" "pytest>=8" "cryptography>=41" "Authlib>=1.3,<2" "requests>=2.31"
  "Django>=4.2,<6" "mozilla-django-oidc>=4,<6" "django-allauth[socialaccount]>=65,<66")
tools_without_dependencies=("axe-playwright-python==0.1.8")
tools_key=$( { echo "${tools_requirements[*]} ${tools_without_dependencies[*]}"; python3 --version; cat "$tools_lib/python-constraints.txt"; } \
  | sha256sum | cut -c1-16)
TOOLS_VENV="$APPLEID_BROKER_CACHE/venvs/tools-$tools_key"
if [ ! -f "$TOOLS_VENV/.installed" ]; then
  mkdir -p "$APPLEID_BROKER_CACHE/venvs"
  (
    flock 9
    if [ ! -f "$TOOLS_VENV/.installed" ]; then
      echo "== installing ${tools_requirements[*]} ${tools_without_dependencies[*]} into $TOOLS_VENV" >&2
      rm -rf "$TOOLS_VENV"
      python3 -m venv "$TOOLS_VENV"
      "$TOOLS_VENV/bin/pip" install --quiet --disable-pip-version-check -c "$tools_lib/python-constraints.txt" "${tools_requirements[@]}"
      "$TOOLS_VENV/bin/pip" install --quiet --disable-pip-version-check -c "$tools_lib/python-constraints.txt" --no-deps \
        "${tools_without_dependencies[@]}"
      touch "$TOOLS_VENV/.installed"
    fi
  ) 9> "$TOOLS_VENV.lock"
fi
