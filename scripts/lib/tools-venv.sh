# A Python virtual environment under .build with the PyPI tools the checks use
# (schemathesis, kubernetes-validate, PyYAML). Sourced; sets TOOLS_VENV.
TOOLS_VENV="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.build/tools-venv"
tools_requirements=("schemathesis>=4.1,<5" "kubernetes-validate>=1.30" "PyYAML>=6")
if [ ! -f "$TOOLS_VENV/.installed" ]; then
  echo "== installing ${tools_requirements[*]} into $TOOLS_VENV" >&2
  python3 -m venv "$TOOLS_VENV"
  "$TOOLS_VENV/bin/pip" install --quiet --disable-pip-version-check "${tools_requirements[@]}"
  touch "$TOOLS_VENV/.installed"
fi
