#!/usr/bin/env bash
# Fuzzing: builds the libFuzzer targets with address sanitizer and runs each from the seed
# corpus in Fuzz/Corpus/<target>, in one of two modes:
#   FUZZ_RUNS=N     (what make test runs) N inputs per target from a fixed seed (FUZZ_SEED, default
#                   37), starting from the checked-in seeds alone, with Swift's hashing fixed and
#                   no learning from compared values (below): the same commit runs the same
#                   inputs and gets the same verdict.
#                   What it finds is discarded (a temporary directory).
#   FUZZ_SECONDS=S  (make fuzz, default 60 s each) exploration with a random seed (printed by
#                   libFuzzer as "INFO: Seed:"), keeping what it finds in .build/fuzz-corpus/<target>
#                   between runs (the checked-in seeds are never rewritten).
# A crash leaves its input in .build/fuzz-artifacts/ and fails the run: turn it into a regression
# test (Tests/JOSETests/FuzzCorpusTests.swift and its BrokerCore twin replay every seed) by adding
# it to the seeds in Fuzz/Corpus/<target>; `FUZZ_SEED=<seed> FUZZ_RUNS=<n>` replays a make test run.
#   [FUZZ_RUNS=N | FUZZ_SECONDS=60] [FUZZ_TARGETS="jose notification request-json"] scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${FUZZ_TARGETS:=jose notification request-json}"
"$PWD/scripts/bootstrap.sh" test
mkdir -p .build/fuzz-artifacts
status=0
scratch=
trap '[ -z "$scratch" ] || rm -rf "$scratch"' EXIT
for target in $FUZZ_TARGETS; do
  echo "== building fuzz-$target (libFuzzer + AddressSanitizer)"
  # BROKER_FUZZ=1 makes Package.swift add the targets and the sanitizer flags.
  # No index store: nothing reads it here (no tests to discover), and writing it costs a fifth of a build.
  BROKER_FUZZ=1 swift build --build-path .build/fuzz --product "fuzz-$target" --disable-index-store 2>&1 \
    | grep -v "Cannot export local symbol" | grep -E "error|warning: |Build of|Compiling fuzz" || true
  binary=.build/fuzz/debug/fuzz-$target
  [ -x "$binary" ] || { echo "fuzz: $binary was not built" >&2; exit 1; }
  if [ -n "${FUZZ_RUNS:-}" ]; then
    # New inputs go to a directory of this run's own: the next run starts from the same seeds.
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/appleid-broker-fuzz.XXXXXX")
    corpus=$scratch
    # -use_cmp=0: the operands of compares libFuzzer learns from include heap addresses and
    # thread ids (Mutex's owner), different in every process; without them, and with Swift's
    # per-process hash seed fixed, two runs execute the same inputs (checked: identical logs).
    budget=(-runs="$FUZZ_RUNS" -seed="${FUZZ_SEED:-37}" -use_cmp=0)
    export SWIFT_DETERMINISTIC_HASHING=1
    echo "== fuzz-$target: $FUZZ_RUNS inputs from seed ${FUZZ_SEED:-37}"
  else
    corpus=.build/fuzz-corpus/$target
    mkdir -p "$corpus"
    budget=(-max_total_time="${FUZZ_SECONDS:-60}")
    echo "== fuzz-$target for ${FUZZ_SECONDS:-60}s"
  fi
  if ! "$binary" "${budget[@]}" -timeout=10 -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
      -artifact_prefix=".build/fuzz-artifacts/$target-" "$corpus" "Fuzz/Corpus/$target" > ".build/fuzz-$target.log" 2>&1; then
    status=1
    echo "fuzz-$target FAILED; its log (.build/fuzz-$target.log) ends:" >&2
    tail -40 ".build/fuzz-$target.log" >&2
    ls -1 .build/fuzz-artifacts/"$target"-* 2>/dev/null >&2 || true
  fi
  grep -E "^INFO: Seed:|^stat::number_of_executed_units|^stat::peak_rss_mb|DONE|cov:" ".build/fuzz-$target.log" | tail -4
  if [ -n "$scratch" ]; then rm -rf "$scratch"; scratch=; fi
done
exit $status
