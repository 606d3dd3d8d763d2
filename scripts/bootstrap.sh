#!/usr/bin/env bash
# Installs the Debian packages appleid-broker needs to build, run and test, if missing.
# Usage: scripts/bootstrap.sh [test]   ("test" adds what the test suite and benchmarks use)
# Runs apt-get as root, or through sudo when available. Idempotent.
set -euo pipefail

packages=(pkg-config libmicrohttpd-dev libpq-dev libssl-dev libcurl4-openssl-dev postgresql openssl)
# The README's tour against `make run`'s demo: curl, and a relying party of the OpenID Provider
# in a few lines of Python with Authlib (Debian's, so the demo needs no virtual environment).
packages+=(curl python3-authlib python3-requests)
if [ "${1:-}" = "test" ]; then
  # nodejs and golang-go run the integration examples (scripts/examples.sh); pgbouncer is
  # started by PgBouncerTests in front of a test cluster (its service kept off like PostgreSQL's).
  # chromium and its driver run the console's browser tests (scripts/console-browser.sh);
  # fonts-dejavu-core gives its screenshots the same glyphs on every machine. apache2 +
  # libapache2-mod-auth-openidc are a relying party of the OpenID Provider (scripts/oidc-rps.sh)
  # and glewlwyd the reference provider of the OIDC benchmark, each run as a throwaway process
  # on loopback (their services kept off too). linux-perf and valgrind profile the login
  # benchmark (a flame graph under load; callgrind's repeatable instruction counts).
  packages+=(wrk procps python3 python3-venv prometheus nodejs golang-go pgbouncer chromium chromium-driver fonts-dejavu-core
    apache2 libapache2-mod-auth-openidc glewlwyd linux-perf valgrind)
fi

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}" >&2
  if [ "$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo"; else
    echo "bootstrap: run as root or install: apt-get install ${missing[*]}" >&2
    exit 1
  fi
  # Keep the system PostgreSQL (and PgBouncer) services from starting: the broker and the
  # tests run their own.
  policy=/usr/sbin/policy-rc.d
  created_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod 755 "$policy"
    created_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq || true
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ -n "$created_policy" ] && $sudo rm -f "$policy"
fi

if ! command -v swift >/dev/null; then
  echo "bootstrap: the Swift 6.3 toolchain is not on PATH (expected /opt/swift/usr/bin/swift)" >&2
  exit 1
fi
