"""The login benchmark's figures in one place (bench-results/login.json), its statement
tables (bench-results/login-statements.md) and the goals of issue 39, one PASS/FAIL line each.

    login_report.py --results DIR --phases login-phases.jsonl --work WORK [--go-peer-log ab.txt]
        [--previous-log ab-previous.txt --previous-version v0.24.0 --previous-commit C] ...

The A/B logs are what ../shared/peers/bench_http.sh prints per server and round (bench_ab.sh
keeps its own in $PEERS_WORK/logs/ab.txt): a `== NAME` line with the smoke check, wrk's
latency and rate, and the CPU per request of the server's process tree and of PostgreSQL.
"""

import argparse
import csv
import json
import os
import re
import statistics

GOAL_CPU = 0.5  # broker + PostgreSQL CPU per repeat login, of the Go peer's (server + PostgreSQL)
GOAL_THROUGHPUT = 1.5  # in every round of the interleaved A/B
GOAL_P99 = 1.0  # of the Go peer's p99 at the same connections
GOAL_PREVIOUS_CPU = 1.1  # CPU per login against the previous release (a regression shows)


def milliseconds(text):
    value = float(re.sub(r"[a-z]+$", "", text))
    return value / 1000 if text.endswith("us") else value if text.endswith("ms") else value * 1000


def parse_rounds(path):
    """Every `== NAME` block of a bench_http.sh log: name, side, round and its figures."""
    blocks, current = [], None
    for line in open(path):
        if line.startswith("== "):
            name = line.split()[1]
            match = re.match(r"(.+)_r(\d+)$", name)
            current = {"name": name, "side": match.group(1) if match else name,
                       "round": int(match.group(2)) if match else 0,
                       "valid": bool(re.search(r"good->200 tampered->4\d\d", line)) and "ERROR" not in line}
            blocks.append(current)
            continue
        if current is None:
            continue
        if re.match(r"^\s+99%", line):
            current["p99_ms"] = milliseconds(line.split()[1])
        elif re.match(r"^\s+50%", line):
            current["p50_ms"] = milliseconds(line.split()[1])
        elif line.startswith("Requests/sec"):
            current["requests_per_second"] = float(line.split()[1])
        elif "requests in" in line:
            current["requests"] = int(line.split()[0])
        elif "non2xx_responses_reported_by_wrk=" in line:
            if int(line.strip().split("=")[1]) > 0:
                current["valid"] = False
        elif "Socket errors" in line or "ERROR" in line:
            current["valid"] = False
        elif "host steal" in line:
            if match := re.search(r"host steal ([0-9.]+)%", line):
                # "round host steal": over the whole round (both sides), bench-login.sh's Go-peer A/B
                key = "round_steal_percent" if "round host steal" in line else "host_steal_percent"
                current[key] = float(match.group(1))
        elif "broker last_login_at writes" in line:
            # bench-login.sh: the broker's refreshes of last_login_at during the round (the
            # rounds that start a minute after the last refresh write once per user)
            if match := re.search(r"writes (\d+)", line):
                current["writes"] = int(match.group(1))
        elif "server CPU" in line:
            fields = line.split()
            current["server_cpu_us_per_request"] = float(fields[2])
            current["postgres_cpu_us_per_request"] = float(fields[6])
    for block in blocks:
        block["valid"] = block["valid"] and "server_cpu_us_per_request" in block and "requests_per_second" in block
    return blocks


def pair_rounds(blocks, a, b):
    """Per round, side a against side b: throughput, CPU (server + PostgreSQL) and p99 ratios."""
    rounds = []
    by_key = {(x["side"], x["round"]): x for x in blocks}
    for number in sorted({x["round"] for x in blocks}):
        left, right = by_key.get((a, number)), by_key.get((b, number))
        if not left or not right:
            continue
        valid = left["valid"] and right["valid"]
        entry = {"round": number, "valid": valid, a: left, b: right}
        steal = left.get("round_steal_percent", right.get("round_steal_percent"))
        if steal is not None:
            entry["host_steal_percent"] = steal
        writes = left.get("writes", right.get("writes"))
        if writes is not None:
            entry["broker_writes"] = writes
        if valid:
            cpu_left = left["server_cpu_us_per_request"] + left["postgres_cpu_us_per_request"]
            cpu_right = right["server_cpu_us_per_request"] + right["postgres_cpu_us_per_request"]
            entry.update(throughput_ratio=left["requests_per_second"] / right["requests_per_second"],
                         cpu_ratio=cpu_left / cpu_right, p99_ratio=left["p99_ms"] / right["p99_ms"])
        rounds.append(entry)
    return rounds


def statement_table(work, kind):
    path = os.path.join(work, f"statements-{kind}.csv")
    if not os.path.exists(path):
        return None
    logins = int(open(os.path.join(work, f"statements-{kind}.logins")).read().strip() or 0)
    rows = []
    for row in csv.DictReader(open(path)):
        calls = int(row["calls"])
        rows.append({"toplevel": row["toplevel"] == "t", "calls_per_login": calls / max(1, logins),
                     "exec_us_per_call": float(row["total_exec_time"]) * 1000 / max(1, calls),
                     "exec_us_per_login": float(row["total_exec_time"]) * 1000 / max(1, logins),
                     "rows_per_call": int(row["rows"]) / max(1, calls), "query": row["query"]})
    rows = [r for r in rows if r["calls_per_login"] >= 0.005]
    rows.sort(key=lambda r: (not r["toplevel"], -r["exec_us_per_login"]))
    return {"logins": logins, "statements": rows,
            "round_trips_per_login": sum(r["calls_per_login"] for r in rows if r["toplevel"]),
            "exec_us_per_login": sum(r["exec_us_per_login"] for r in rows if r["toplevel"])}


def markdown_tables(tables):
    out = []
    titles = {"repeat_login": "Repeat logins", "first_login": "First logins", "code_exchange": "Code exchanges"}
    for kind, table in tables.items():
        out.append(f"### {titles[kind]} ({table['logins']} logins; {table['round_trips_per_login']:.2f} statements "
                   f"from the broker per login, {table['exec_us_per_login']:.0f} µs of execution)\n")
        out.append("| from | calls per login | µs per call | µs per login | rows per call | statement |")
        out.append("| --- | ---: | ---: | ---: | ---: | --- |")
        for row in table["statements"]:
            query = row["query"].replace("|", "\\|")
            query = query if len(query) <= 140 else query[:137] + "..."
            out.append(f"| {'broker' if row['toplevel'] else 'in a function'} | {row['calls_per_login']:.2f} | "
                       f"{row['exec_us_per_call']:.1f} | {row['exec_us_per_login']:.1f} | {row['rows_per_call']:.2f} | "
                       f"`{query}` |")
        out.append("")
    return "\n".join(out)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main():
    parser = argparse.ArgumentParser()
    for name in ("results", "phases", "work", "connections", "duration", "tokens", "rss", "pgbench", "go-peer-log",
                 "previous-log", "previous-version", "previous-commit", "go-peer-steal", "steal-max", "rounds"):
        parser.add_argument("--" + name)
    args = parser.parse_args()
    phases = {}
    for line in open(args.phases):
        phase = json.loads(line)
        phases[phase["kind"]] = phase
    repeat = phases.get("repeat_login", {})
    tables = {kind: t for kind in ("repeat_login", "first_login", "code_exchange")
              if (t := statement_table(args.work, kind)) is not None}

    go_rounds = pair_rounds(parse_rounds(args.go_peer_log), "A_service", "B_gopeer") if args.go_peer_log else []
    previous_rounds = pair_rounds(parse_rounds(args.previous_log), "current", "previous") if args.previous_log else []
    # Rounds during which the hypervisor stole more than --steal-max % of the machine's CPU time
    # were run again (bench-login.sh); the goals judge the calm ones, or every valid round when
    # fewer than --rounds were calm, so noise can stretch a run but never hide a figure.
    steal_max = float(args.steal_max) if args.steal_max else None
    valid_go = [r for r in go_rounds if r["valid"]]
    calm_go = [r for r in valid_go if steal_max is None or r.get("host_steal_percent", 0) <= steal_max]
    wanted = int(args.rounds) if args.rounds else len(valid_go)
    judged_go = calm_go if len(calm_go) >= min(wanted, len(valid_go)) else valid_go
    for r in go_rounds:
        r["judged"] = r in judged_go
    valid_previous = [r for r in previous_rounds if r["valid"]]

    def side_median(rounds, side, key):
        return median([r[side].get(key) for r in rounds])

    summary = {
        "benchmark": "login", "connections": int(args.connections), "duration": args.duration, "tokens": int(args.tokens),
        # The stand-alone repeat-login figures keep the names earlier runs used (bench-report.py).
        "requests_per_second": repeat.get("requests_per_second"), "p50_ms": repeat.get("p50_ms"),
        "p99_ms": repeat.get("p99_ms"), "non_2xx": repeat.get("non_2xx"),
        "broker_cpu_us_per_request": repeat.get("broker_cpu_us_per_request"),
        "postgres_cpu_us_per_request": repeat.get("postgres_cpu_us_per_request"),
        "broker_peak_rss_mib": float(args.rss) if args.rss else None,
        "pgbench_same_upsert_tps": float(args.pgbench) or None,
        "phases": phases,
        "statements": tables,
        "go_peer": {
            "rounds": go_rounds,
            "throughput_ratio_min": min((r["throughput_ratio"] for r in judged_go), default=None),
            "throughput_ratio_median": median([r["throughput_ratio"] for r in judged_go]),
            "cpu_ratio_median": median([r["cpu_ratio"] for r in judged_go]),
            "cpu_ratio_max": max((r["cpu_ratio"] for r in judged_go), default=None),
            "p99_ratio_median": median([r["p99_ratio"] for r in judged_go]),
            "broker_cpu_us_median": side_median(judged_go, "A_service", "server_cpu_us_per_request"),
            "broker_postgres_cpu_us_median": side_median(judged_go, "A_service", "postgres_cpu_us_per_request"),
            "peer_cpu_us_median": side_median(judged_go, "B_gopeer", "server_cpu_us_per_request"),
            "peer_postgres_cpu_us_median": side_median(judged_go, "B_gopeer", "postgres_cpu_us_per_request"),
            "broker_p99_ms_median": side_median(judged_go, "A_service", "p99_ms"),
            "peer_p99_ms_median": side_median(judged_go, "B_gopeer", "p99_ms"),
            "all_rounds_valid": bool(go_rounds) and len(valid_go) == len(go_rounds),
            "steal_max_percent": steal_max,
            "rounds_judged": len(judged_go),
            # The hypervisor's share of the machine's CPU time over the whole A/B (/proc/stat).
            "host_steal_percent": float(args.go_peer_steal) if args.go_peer_steal else None,
        } if args.go_peer_log else None,
        "previous_release": {
            "version": args.previous_version, "commit": args.previous_commit, "rounds": previous_rounds,
            "throughput_ratio_median": median([r["throughput_ratio"] for r in valid_previous]),
            "cpu_ratio_median": median([r["cpu_ratio"] for r in valid_previous]),
            "p99_ratio_median": median([r["p99_ratio"] for r in valid_previous]),
            "all_rounds_valid": bool(previous_rounds) and len(valid_previous) == len(previous_rounds),
        } if args.previous_log else None,
    }
    go = summary["go_peer"]
    # The names earlier runs used for the A/B (bench-report.py): CPU efficiency is the peer's
    # server CPU over the broker's, without PostgreSQL, as bench_ab.sh prints it.
    summary["ab_throughput_ratio_vs_go_peer"] = go and go["throughput_ratio_median"]
    summary["ab_cpu_efficiency_ratio_vs_go_peer"] = go and median(
        [r["B_gopeer"]["server_cpu_us_per_request"] / r["A_service"]["server_cpu_us_per_request"] for r in judged_go])

    goals = []
    if go is not None:
        goals += [
            {"goal": "CPU per repeat login (broker + PostgreSQL) <= 0.5 of the Go peer's (server + PostgreSQL), "
                     "median of rounds", "value": go["cpu_ratio_median"], "bound": GOAL_CPU, "at_most": True},
            {"goal": "throughput >= 1.5x the Go peer's in every round (the lowest round"
                     + (f" of host steal <= {steal_max:g}%" if steal_max is not None and judged_go is calm_go else "") + ")",
             "value": go["throughput_ratio_min"], "bound": GOAL_THROUGHPUT, "at_most": False},
            {"goal": "p99 at {} connections no worse than the Go peer's (median of per-round ratios)".format(
                args.connections), "value": go["p99_ratio_median"], "bound": GOAL_P99, "at_most": True},
        ]
    if summary["previous_release"] is not None:
        goals.append({"goal": f"no regression against {args.previous_version}: CPU per login (broker + PostgreSQL) "
                              f"<= 1.1x its own, median of rounds",
                      "value": summary["previous_release"]["cpu_ratio_median"], "bound": GOAL_PREVIOUS_CPU,
                      "at_most": True})
    for goal in goals:
        value = goal["value"]
        goal["met"] = None if value is None else (value <= goal["bound"] if goal["at_most"] else value >= goal["bound"])
    if go is not None and not go["all_rounds_valid"]:
        goals[1]["met"] = False  # a round that failed a gate cannot count as met
    summary["goals"] = goals

    with open(os.path.join(args.results, "login.json"), "w") as handle:
        json.dump(summary, handle, indent=1)
    if tables:
        with open(os.path.join(args.results, "login-statements.md"), "w") as handle:
            handle.write(markdown_tables(tables))

    print("\n== login: CPU per request, broker + its PostgreSQL (from /proc), this build alone against apple-sim")
    names = {"first_login": "first logins", "repeat_login": "repeat logins", "code_exchange": "code exchanges"}
    for kind in ("first_login", "repeat_login", "code_exchange"):
        if kind in phases:
            p = phases[kind]
            note = "" if kind == "repeat_login" or not p["all_lines_used"] else "  (every token used: rate over that time)"
            print(f"  {names[kind]:<16}{p['requests_per_second']:>9.0f} /s  p50 {p['p50_ms']:7.2f} ms  p99 {p['p99_ms']:7.2f} ms"
                  f"  broker {p['broker_cpu_us_per_request']:6.1f} + PostgreSQL {p['postgres_cpu_us_per_request']:6.1f}"
                  f" = {p['broker_cpu_us_per_request'] + p['postgres_cpu_us_per_request']:6.1f} us/request"
                  f"  non-2xx {p['non_2xx']}{note}")
    for kind, table in tables.items():
        print(f"  statements per {names[kind][:-1]}: {table['round_trips_per_login']:.2f} from the broker, "
              f"{table['exec_us_per_login']:.0f} us executing (bench-results/login-statements.md)")
    if go is not None:
        print("== A/B against the Go peer, per round: throughput ratio, CPU per request (server + PostgreSQL), p99")
        for r in go_rounds:
            a, b = r["A_service"], r["B_gopeer"]
            if not r["valid"]:
                print(f"  round {r['round']}: NOT VALID (a smoke check, wrk error or non-2xx answer; see the log)")
                continue
            print(f"  round {r['round']}: broker {a['requests_per_second']:7.0f} /s {a['server_cpu_us_per_request']:6.1f} + "
                  f"{a['postgres_cpu_us_per_request']:6.1f} us p99 {a['p99_ms']:6.1f} ms | Go peer "
                  f"{b['requests_per_second']:7.0f} /s {b['server_cpu_us_per_request']:6.1f} + "
                  f"{b['postgres_cpu_us_per_request']:6.1f} us p99 {b['p99_ms']:6.1f} ms | x{r['throughput_ratio']:.2f}, "
                  f"CPU {r['cpu_ratio']:.2f}, p99 {r['p99_ratio']:.2f}"
                  + (f", host steal {r['host_steal_percent']:.1f}%" if "host_steal_percent" in r else "")
                  + (f", broker writes {r['broker_writes']}" if "broker_writes" in r else "")
                  + ("" if r["judged"] else " (not judged: steal over the bound, run again)"))
        if go["host_steal_percent"] is not None:
            print(f"  host steal over the A/B: {go['host_steal_percent']:.1f}% of the machine's CPU time")
    previous = summary["previous_release"]
    if previous is not None:
        print(f"== A/B against the previous release {args.previous_version}, per round (this build / previous)")
        for r in previous_rounds:
            a, b = r["current"], r["previous"]
            if not r["valid"]:
                print(f"  round {r['round']}: NOT VALID (see the log)")
                continue
            print(f"  round {r['round']}: this build {a['requests_per_second']:7.0f} /s {a['server_cpu_us_per_request']:6.1f} + "
                  f"{a['postgres_cpu_us_per_request']:6.1f} us p99 {a['p99_ms']:6.1f} ms | {args.previous_version} "
                  f"{b['requests_per_second']:7.0f} /s {b['server_cpu_us_per_request']:6.1f} + "
                  f"{b['postgres_cpu_us_per_request']:6.1f} us p99 {b['p99_ms']:6.1f} ms | x{r['throughput_ratio']:.2f}, "
                  f"CPU {r['cpu_ratio']:.2f}, p99 {r['p99_ratio']:.2f}"
                  + (f", host steal {a.get('host_steal_percent', 0):.1f}% / {b.get('host_steal_percent', 0):.1f}%"
                     if "host_steal_percent" in a else ""))
        if previous["throughput_ratio_median"] is not None:
            print(f"  medians: throughput x{previous['throughput_ratio_median']:.2f}, CPU per login "
                  f"{previous['cpu_ratio_median']:.2f} of {args.previous_version}'s, p99 {previous['p99_ratio_median']:.2f}")
    print("== goals (issue 39)")
    for goal in goals:
        verdict = {True: "PASS", False: "FAIL", None: "FAIL (not measured)"}[goal["met"]]
        value = "-" if goal["value"] is None else f"{goal['value']:.2f}"
        print(f"{verdict}: {goal['goal']}: {value} (bound {goal['bound']})")
    print("written: bench-results/login.json" + (", bench-results/login-statements.md" if tables else ""))


if __name__ == "__main__":
    main()
