# A Python virtual environment under .build with the PyPI tools the checks use
# (schemathesis, kubernetes-validate, PyYAML, standardwebhooks for the examples' deliveries;
# matplotlib for the benchmark chart only; Authlib and requests for the OpenID Connect relying
# parties of scripts/oidc-rps.sh and the OIDC benchmark).
# Sourced; sets TOOLS_VENV. Reinstalls when the list below changes.
TOOLS_VENV="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.build/tools-venv"
tools_requirements=("schemathesis>=4.1,<5" "kubernetes-validate>=1.30" "PyYAML>=6" "matplotlib>=3.8" "standardwebhooks>=1.1" "Authlib>=1.3,<2" "requests>=2.31")
if [ "$(cat "$TOOLS_VENV/.installed" 2>/dev/null)" != "${tools_requirements[*]}" ]; then
  echo "== installing ${tools_requirements[*]} into $TOOLS_VENV" >&2
  python3 -m venv "$TOOLS_VENV"
  "$TOOLS_VENV/bin/pip" install --quiet --disable-pip-version-check "${tools_requirements[@]}"
  echo "${tools_requirements[*]}" > "$TOOLS_VENV/.installed"
fi
