#!/usr/bin/env bash
# make fuzz: builds the libFuzzer targets with address sanitizer and runs each for
# FUZZ_SECONDS (default 60) from the seed corpus in Fuzz/Corpus/<target>. New inputs go to
# .build/fuzz-corpus/<target> (the checked-in seeds are never rewritten); a crash leaves
# its input in .build/fuzz-artifacts/ and fails the run: turn it into a regression test
# (Tests/JOSETests/FuzzCorpusTests.swift and its BrokerCore twin replay every seed) by adding it
# to the seeds in Fuzz/Corpus/<target>.
#   [FUZZ_SECONDS=60] [FUZZ_TARGETS="jose notification request-json"] scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${FUZZ_SECONDS:=60}"
: "${FUZZ_TARGETS:=jose notification request-json}"
"$PWD/scripts/bootstrap.sh" test
mkdir -p .build/fuzz-artifacts
status=0
for target in $FUZZ_TARGETS; do
  echo "== building fuzz-$target (libFuzzer + AddressSanitizer)"
  # BROKER_FUZZ=1 makes Package.swift add the targets and the sanitizer flags.
  BROKER_FUZZ=1 swift build --build-path .build/fuzz --product "fuzz-$target" 2>&1 \
    | grep -v "Cannot export local symbol" | grep -E "error|warning: |Build of|Compiling fuzz" || true
  binary=.build/fuzz/debug/fuzz-$target
  [ -x "$binary" ] || { echo "fuzz: $binary was not built" >&2; exit 1; }
  corpus=.build/fuzz-corpus/$target
  mkdir -p "$corpus"
  echo "== fuzz-$target for ${FUZZ_SECONDS}s"
  if ! "$binary" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
      -artifact_prefix=".build/fuzz-artifacts/$target-" "$corpus" "Fuzz/Corpus/$target" > ".build/fuzz-$target.log" 2>&1; then
    status=1
    echo "fuzz-$target FAILED; its log (.build/fuzz-$target.log) ends:" >&2
    tail -40 ".build/fuzz-$target.log" >&2
    ls -1 .build/fuzz-artifacts/"$target"-* 2>/dev/null >&2 || true
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|DONE|cov:" ".build/fuzz-$target.log" | tail -3
done
exit $status
