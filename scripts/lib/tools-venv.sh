# A Python virtual environment with the PyPI tools the checks use (schemathesis,
# kubernetes-validate, PyYAML, standardwebhooks for the examples' deliveries; matplotlib for the
# benchmark chart only; Authlib and requests for the OpenID Connect relying parties of
# scripts/oidc-rps.sh and the OIDC benchmark, with Django, mozilla-django-oidc and
# django-allauth for its two Django relying parties; selenium, pytest and cryptography for the console's
# browser tests, with axe-playwright-python as the source of axe.min.js only: installed without
# its dependencies, since Playwright and its browser download are not used).
# Every package at the exact version scripts/lib/python-constraints.txt names, so the same commit
# runs the same tools; installed once per machine under that key (scripts/lib/venv.sh). Sourced; sets TOOLS_VENV.
# shellcheck source=venv.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/venv.sh"
cached_venv TOOLS_VENV tools "schemathesis>=4.1,<5" "kubernetes-validate>=1.30" "PyYAML>=6" "matplotlib>=3.8" \
  "standardwebhooks>=1.1" "selenium>=4.20,<5" "pytest>=8" "cryptography>=41" "Authlib>=1.3,<2" "requests>=2.31" \
  "Django>=4.2,<6" "mozilla-django-oidc>=4,<6" "django-allauth[socialaccount]>=65,<66" \
  -- "axe-playwright-python==0.1.8"
