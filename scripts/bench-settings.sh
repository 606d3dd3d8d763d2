#!/usr/bin/env bash
# make bench-settings: two broker settings (or two builds) against each other on repeat logins,
# interleaved like the Go-peer A/B: one PostgreSQL cluster, a database per side, the same RS256
# tokens, every user signed in once per side first, then ROUNDS rounds of DUR at CONNS
# connections (after bench_http.sh's warm-up), the side that goes first alternating. Prints
# each round's throughput, p99 and CPU per login (broker + its PostgreSQL), then the medians and
# B's CPU over A's per round. For a setting's default: docs/benchmarks.md "2026-12-04, sixth".
#   A_ENV="BROKER_HTTP_THREADS=8" B_ENV="BROKER_HTTP_THREADS=32" [A_BIN=dir] [B_BIN=dir]
#   [ROUNDS=6] [DUR=15s] [CONNS=32] scripts/bench-settings.sh
. "$(dirname "$0")/bench/common.sh"
# shellcheck source=bench/peers.sh
source "$ROOT/scripts/bench/peers.sh"
: "${ROUNDS:=6}" "${A_ENV:=}" "${B_ENV:=}"
"$ROOT/scripts/bootstrap.sh" test
if [ -z "${A_BIN:-}" ] || [ -z "${B_BIN:-}" ]; then build_release; fi
: "${A_BIN:=$BIN}" "${B_BIN:=$BIN}"
trap 'peers_stop' EXIT
peers_start
PG_MASTER_PID=$(head -1 "$PGDIR/data/postmaster.pid")
export PG_MASTER_PID
ensure_tokens RS256
[ -f "$WORK/AuthKey.p8" ] || openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$WORK/AuthKey.p8" 2> /dev/null
TOKEN_ENCRYPTION_KEY=$(openssl rand -base64 32)
export APPLE_PRIVATE_KEY_PATH=$WORK/AuthKey.p8 TOKEN_ENCRYPTION_KEY BROKER_DATA_DIR=$WORK/data
export APPLE_CLIENT_IDS=$AUDIENCE APPLE_BASE_URL=${JWKS_URL%/auth/keys} APPLE_TOKEN_MAX_AGE_SECONDS=7200
peers_jwks_start
LOG=$WORK/ab-settings.txt
ROUNDS_LOG=$WORK/ab-settings-rounds.txt
: > "$LOG"
: > "$ROUNDS_LOG"
declare -A SIDE_BIN=([a]=$A_BIN [b]=$B_BIN) SIDE_ENV=([a]=$A_ENV [b]=$B_ENV) SIDE_KEY=() SIDE_PORT=()
echo "A: ${A_ENV:-(defaults)} ($A_BIN)"
echo "B: ${B_ENV:-(defaults)} ($B_BIN)"
for side in a b; do
  peers_fresh_database "settings_$side"
  SIDE_PORT[$side]=$(free_port)
  # shellcheck disable=SC2086 # the side's settings are words of NAME=VALUE
  SIDE_KEY[$side]=$(ab_prime "settings-$side" "${SIDE_BIN[$side]}" "settings_$side" "${SIDE_PORT[$side]}" ${SIDE_ENV[$side]})
done
for round in $(seq 1 "$ROUNDS"); do
  order="a b"
  [ $((round % 2)) = 0 ] && order="b a"
  for side in $order; do
    # shellcheck disable=SC2086
    DATABASE_URL="$(database_url "settings_$side")" BROKER_LISTEN=127.0.0.1:${SIDE_PORT[$side]} \
      URLPATH=/v1/apple/login API_KEY=${SIDE_KEY[$side]} \
      "$PEERS/bench_http.sh" "${side}_r$round" "${SIDE_PORT[$side]}" "$TOKENS_RS256" "$DUR" "$CONNS" \
      -- env ${SIDE_ENV[$side]} "${SIDE_BIN[$side]}/appleid-broker" serve >> "$LOG"
    grep -A13 "^== ${side}_r$round" "$LOG" | awk -v s="${side^^}" -v r="$round" \
      '/Requests\/sec/{q=$2} /^ +99%/{p=$2} /server CPU/{c=$3; g=$7} /non2xx_responses_reported_by_wrk=/{split($0, n, "="); e=n[2]}
       END{printf "round %s %s %9s req/s  p99 %8s  broker %6s + PostgreSQL %6s us/login  non-2xx %s\n", r, s, q, p, c, g, e}' |
      tee -a "$ROUNDS_LOG"
  done
done
peers_jwks_stop
python3 - "$ROUNDS_LOG" <<'PY'
import re, statistics, sys
sides = {"A": {}, "B": {}}
for line in open(sys.argv[1]):
    m = re.match(r"round (\d+) (\w) +(\S+) req/s +p99 +(\S+) +broker +(\S+) \+ PostgreSQL +(\S+) us/login +non-2xx (\d*)", line)
    if not m:
        continue
    if m[7] not in ("", "0"):
        sys.exit(f"round {m[1]} {m[2]}: {m[7]} answers were not 2xx; the figures are not of logins")
    sides[m[2]][int(m[1])] = (float(m[3]), float(m[5]) + float(m[6]))
rounds = sorted(set(sides["A"]) & set(sides["B"]))
if not rounds:
    sys.exit("no complete round")
for s in "AB":
    print(f"{s}: median {statistics.median(sides[s][r][0] for r in rounds):,.0f} logins/s, "
          f"{statistics.median(sides[s][r][1] for r in rounds):.1f} us per login (broker + PostgreSQL)")
ratios = [sides["B"][r][1] / sides["A"][r][1] for r in rounds]
print("B's CPU per login / A's, per round: " + ", ".join(f"{x:.2f}" for x in ratios)
      + f"; median {statistics.median(ratios):.2f}; B cheaper in {sum(x < 1 for x in ratios)} of {len(ratios)}")
PY
