#!/usr/bin/env bash
# make fuzz-api: random exploration of the API against docs/openapi.json. The same stage as
# make test's API conformance (scripts/api-conformance.sh: the pinned cases, then schemathesis),
# with a random seed and more examples per operation. The seed is printed first, so that a
# finding can be replayed exactly; fix it, then pin the request in scripts/api-cases.py.
# Usage: [SCHEMATHESIS_SEED=N] scripts/fuzz-api.sh [examples per operation, default 100]
set -euo pipefail
cd "$(dirname "$0")/.."
examples=${1:-100}
seed=${SCHEMATHESIS_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
echo "fuzz-api: seed $seed, $examples examples per operation" \
  "(replay: SCHEMATHESIS_SEED=$seed scripts/api-conformance.sh $examples)" >&2
SCHEMATHESIS_SEED=$seed exec scripts/api-conformance.sh "$examples"
