#!/usr/bin/env bash
# make bench: every benchmark from one run on this machine, with the references taken in
# the same run, then one summary (bench-results/bench.json) and a chart (bench.png).
#   1. crypto: `openssl speed rsa2048` verify and the broker's full identity-token
#      validation, both pinned to core 0, back to back, ROUNDS times (the median of the
#      per-round ratios is the figure: this machine's speed drifts between rounds);
#   2. login (wrk, pgbench on the same upsert, interleaved A/B against the Go peer);
#   3. notification ingestion (wrk, pgbench on the same apply);
#   4. deletion (revoke latency 100 ms, concurrency 32);
#   5. webhook delivery (backlog drain, paced latency, pgbench on the same claim);
#   6. the OpenID Provider against Glewlwyd 2.7 (code exchanges and userinfo, interleaved).
#   [ROUNDS=5] [CONNS=32] [DUR=15s] [AB=0 to skip the A/B] [ONLY=crypto] scripts/bench.sh
# ONLY=crypto measures the crypto figures again and redraws the summary from the others.
. "$(dirname "$0")/bench/common.sh"
: "${ROUNDS:=5}"
: "${ONLY:=}"
"$ROOT/scripts/bootstrap.sh" test
build_release

echo "== crypto: openssl speed rsa2048 vs broker-bench verify on core 0, $ROUNDS interleaved rounds"
: > "$WORK/crypto.txt"
for round in $(seq 1 "$ROUNDS"); do
  openssl_rate=$(taskset -c 0 openssl speed -seconds 2 rsa2048 2>/dev/null | awk '/^rsa 2048/{print $NF}')
  broker_json=$(taskset -c 0 "$BIN/broker-bench" verify --only validate --seconds 2 --json | tail -1)
  # Per user-CPU second, the divisor openssl speed itself uses (unless given -elapsed).
  jwt_rate=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["jwt_verify_per_cpu_s"])' "$broker_json")
  printf "round %s: openssl speed rsa2048 verify %9.0f /s   broker JWT validate %9.0f /s   ratio %.2f\n" \
    "$round" "$openssl_rate" "$jwt_rate" "$(awk -v a="$jwt_rate" -v b="$openssl_rate" 'BEGIN{print a/b}')"
  echo "$openssl_rate $jwt_rate" >> "$WORK/crypto.txt"
done
# The same ratio free of the machine's drift: openssl speed's own operation (EVP_PKEY_verify
# of 36 bytes, no hash), bare RSA with SHA-256 and each layer of validation, in alternating
# 10 ms slices of one process.
overhead_json=$(taskset -c 0 "$BIN/broker-bench" verify --interleaved --seconds 4 --json | tail -1)
python3 - "$WORK/crypto.txt" "$RESULTS/crypto.json" "$overhead_json" <<'PY'
import json, statistics, sys
rows = [tuple(map(float, line.split())) for line in open(sys.argv[1]) if line.strip()]
openssl = statistics.median(r[0] for r in rows)
jwt = statistics.median(r[1] for r in rows)
ratio = statistics.median(r[1] / r[0] for r in rows)
interleaved = json.loads(sys.argv[3])
to_rsa, to_speed_op = interleaved["validate_to_rsa_verify"], interleaved["validate_to_openssl_speed_op"]
json.dump({"benchmark": "crypto", "rounds": len(rows), "openssl_rsa2048_verify_per_s": round(openssl),
           "jwt_verify_per_s_per_core": round(jwt), "ratio_to_openssl": round(ratio, 3),
           "round_ratios": [round(r[1] / r[0], 3) for r in rows],
           "validate_to_rsa_verify_interleaved": round(to_rsa, 3),
           "validate_to_openssl_speed_op_interleaved": round(to_speed_op, 3)}, open(sys.argv[2], "w"))
print(f"median: openssl {openssl:.0f} /s, broker {jwt:.0f} /s per core, ratio {ratio:.2f}; "
      f"interleaved in one process, full validation / openssl speed's verify operation: {to_speed_op:.2f}, "
      f"/ bare RSA verify with SHA-256: {to_rsa:.2f}")
PY

if [ "$ONLY" != crypto ]; then
  "$ROOT/scripts/bench-login.sh"
  "$ROOT/scripts/bench-notifications.sh"
  "$ROOT/scripts/bench-deletion.sh"
  "$ROOT/scripts/bench-webhooks.sh"
  "$ROOT/scripts/bench-oidc.sh"
fi

# shellcheck source=lib/tools-venv.sh
source "$ROOT/scripts/lib/tools-venv.sh"
"$TOOLS_VENV/bin/python" "$ROOT/scripts/bench-report.py" "$RESULTS"
# docs/benchmarks.md opens with this run's figures (a full run only: a partial one would mix).
[ "$ONLY" = crypto ] || python3 "$ROOT/scripts/bench-docs.py" "$RESULTS/bench.json" "$ROOT/docs/benchmarks.md"
