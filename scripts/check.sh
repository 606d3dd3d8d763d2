#!/usr/bin/env bash
# make check: the fast gate, under two minutes on a warm build (docs/testing.md has the times).
#   1. a strict build (warnings are errors) in a build path of its own, .build/check, so it
#      neither rebuilds nor is rebuilt by what `make test` builds in .build;
#   2. `swift format lint --strict` against the checked-in .swift-format;
#   3. the database-free suites: rules, parsers, vectors, routes through the router, the HTTP
#      server and the simulator on loopback. No PostgreSQL is started.
# `make test` stays the whole truth; this is what to run before every commit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="/opt/swift/usr/bin:$PATH"
# shellcheck source=lib/suites.sh
source scripts/lib/suites.sh

stage() { printf '== %s\n' "$1" >&2; }
started=$SECONDS
stage "declared imports (scripts/check-imports.py)"
python3 scripts/check-imports.py
stage "strict build (.build/check, warnings are errors)"
# The build's own status decides (a status read after `| … || true` is that of `true`); its
# output is shown without the progress lines.
mkdir -p .build
if ! swift build --build-tests --scratch-path .build/check -Xswiftc -warnings-as-errors > .build/check-build.log 2>&1; then
  grep -Ev "^\[[0-9]+/[0-9]+\]" .build/check-build.log >&2
  echo "check: the strict build failed" >&2
  exit 1
fi
built=$SECONDS
stage "swift format lint --strict"
swift format lint --strict --recursive --parallel Package.swift Sources Tests Plugins Fuzz
linted=$SECONDS
stage "database-free suites: $DATABASE_FREE_SUITES"
swift test --skip-build --scratch-path .build/check --filter "$DATABASE_FREE_SUITES"
printf 'check: build %ss, lint %ss, suites %ss, total %ss\n' \
  $((built - started)) $((linted - built)) $((SECONDS - linted)) $((SECONDS - started)) >&2
