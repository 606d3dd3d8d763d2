# A Python virtual environment with openapi-python-client (PyPI), the generator
# scripts/generated-client.sh runs, at the exact versions scripts/lib/python-constraints.txt
# names; installed once per machine under that key (scripts/lib/venv.sh). Nothing is installed
# into it afterwards (the generated client goes to a directory of the run's own).
# Sourced; sets GENERATOR_VENV.
# shellcheck source=venv.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/venv.sh"
cached_venv GENERATOR_VENV generator "openapi-python-client>=0.21,<1"
