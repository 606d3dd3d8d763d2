# A Python virtual environment under .build with the PyPI tools the checks use
# (schemathesis, kubernetes-validate, PyYAML, standardwebhooks for the examples' deliveries;
# matplotlib for the benchmark chart only; Authlib and requests for the OpenID Connect relying
# parties of scripts/oidc-rps.sh and the OIDC benchmark, with Django, mozilla-django-oidc and
# django-allauth for its two Django relying parties; selenium, pytest and cryptography for the console's
# browser tests, with axe-playwright-python as the source of axe.min.js only: installed without
# its dependencies, since Playwright and its browser download are not used).
# Sourced; sets TOOLS_VENV. Reinstalls when the list below changes.
TOOLS_VENV="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.build/tools-venv"
tools_requirements=("schemathesis>=4.1,<5" "kubernetes-validate>=1.30" "PyYAML>=6" "matplotlib>=3.8" "standardwebhooks>=1.1"
  "selenium>=4.20,<5" "pytest>=8" "cryptography>=41" "Authlib>=1.3,<2" "requests>=2.31"
  "Django>=4.2,<6" "mozilla-django-oidc>=4,<6" "django-allauth[socialaccount]>=65,<66")
tools_without_dependencies=("axe-playwright-python==0.1.8")
if [ "$(cat "$TOOLS_VENV/.installed" 2>/dev/null)" != "${tools_requirements[*]} ${tools_without_dependencies[*]}" ]; then
  echo "== installing ${tools_requirements[*]} ${tools_without_dependencies[*]} into $TOOLS_VENV" >&2
  python3 -m venv "$TOOLS_VENV"
  "$TOOLS_VENV/bin/pip" install --quiet --disable-pip-version-check "${tools_requirements[@]}"
  "$TOOLS_VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps "${tools_without_dependencies[@]}"
  echo "${tools_requirements[*]} ${tools_without_dependencies[*]}" > "$TOOLS_VENV/.installed"
fi
