"""Writes the current-figures table at the top of docs/benchmarks.md from bench-results/bench.json
(the latest `make bench`), between its two `current-figures` markers, so the table is always
one run's figures with their references from that same run and cannot drift from them.

    python3 scripts/bench-docs.py [bench-results/bench.json] [docs/benchmarks.md]

`make bench` runs it last; run it by hand after a run whose figures should replace the table.
"""

import json
import sys

BEGIN = "<!-- current-figures: written by scripts/bench-docs.py from bench-results/bench.json; do not edit by hand -->"
END = "<!-- /current-figures -->"


def number(value, digits=0):
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def verdict(goal):
    return {True: "PASS", False: "**FAIL**", None: "not measured"}[goal["met"]]


def table(bench):
    details = bench.get("details", {})
    login = details.get("login", {})
    go = login.get("go_peer") or {}
    previous = login.get("previous_release") or {}
    machine = bench.get("machine", {})
    load = machine.get("load_average")
    lines = [
        f"From `make bench` at commit `{bench.get('commit')}`, {bench.get('taken_at')}, on {machine.get('cpus')} CPUs "
        f"({machine.get('platform')}" + (f"; load average {load[0]:.1f} at the end" if load else "") + "). "
        "Each ratio is against its reference measured in the same run.",
        "",
        "| goal | figure | reference, same run | |",
        "| --- | --- | --- | --- |",
    ]
    for goal in bench.get("goals", []):
        value = "-" if goal["value"] is None else f"{goal['value']:.2f}"
        bound = ("≤ " if goal.get("at_most") else "≥ ") + str(goal["bound"]) if goal["bound"] is not None else ""
        lines.append(f"| {goal['goal']} | {value} ({bound}) | {reference_of(goal['goal'], bench)} | {verdict(goal)} |")
    lines += ["", "| request | broker CPU µs | its PostgreSQL CPU µs | total µs | from |", "| --- | ---: | ---: | ---: | --- |"]
    for row in bench.get("cpu_per_request", []):
        lines.append(f"| {row['request']} | {number(row['broker_us'])} | {number(row['postgres_us'])} | "
                     f"{number(row['total_us'])} | {row['source']} |")
    if go.get("rounds"):
        lines += ["", "Login A/B rounds (interleaved, 32 connections): this build against the Go peer"
                  + (f" and against {previous.get('version')}" if previous.get("rounds") else "") + ".", "",
                  "| round | this build /s | CPU µs (broker + PostgreSQL) | p99 ms | other side | its /s | its CPU µs | its p99 ms | throughput | CPU | p99 |",
                  "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for label, rounds, a, b in (("Go peer", go.get("rounds", []), "A_service", "B_gopeer"),
                                    (previous.get("version"), previous.get("rounds", []), "current", "previous")):
            for r in rounds:
                if not r.get("valid"):
                    lines.append(f"| {r['round']} | not valid | | | {label} | | | | | | |")
                    continue
                x, y = r[a], r[b]
                judged = "" if r.get("judged", True) else " (not judged: host steal over the bound, run again)"
                lines.append(
                    f"| {r['round']}{judged} | {number(x['requests_per_second'])} | {x['server_cpu_us_per_request']:.0f} + "
                    f"{x['postgres_cpu_us_per_request']:.0f} | {x['p99_ms']:.1f} | {label} | {number(y['requests_per_second'])} | "
                    f"{y['server_cpu_us_per_request']:.0f} + {y['postgres_cpu_us_per_request']:.0f} | {y['p99_ms']:.1f} | "
                    f"{r['throughput_ratio']:.2f}× | {r['cpu_ratio']:.2f} | {r['p99_ratio']:.2f} |")
        steal = [f"over the Go peer's A/B {go['host_steal_percent']:.1f}%"] if go.get("host_steal_percent") is not None else []
        steal += [f"Go peer round {r['round']}: {r['host_steal_percent']:.1f}%" for r in go.get("rounds", [])
                  if "host_steal_percent" in r]
        steal += [f"{previous.get('version')} round {r['round']}: {r['current']['host_steal_percent']:.1f}% (this build), "
                  f"{r['previous']['host_steal_percent']:.1f}% ({previous.get('version')})"
                  for r in previous.get("rounds", [])
                  if all("host_steal_percent" in r.get(side, {}) for side in ("current", "previous"))]
        if steal:
            lines += ["", "Host steal (the hypervisor's share of this machine's CPU time, /proc/stat; it slows a round "
                      "and raises its CPU per request): " + "; ".join(steal) + "."]
            if go.get("steal_max_percent") is not None:
                lines[-1] += (f" A Go-peer round with more than {go['steal_max_percent']:g}% is run again and not judged, "
                              "unless fewer than the rounds asked for were calm.")
        writes = [f"round {r['round']}: {number(r['broker_writes'])}" for r in go.get("rounds", []) if "broker_writes" in r]
        if writes:
            lines += ["", "This build's writes of `last_login_at` per Go-peer round (a round that starts more than "
                      "`BROKER_LAST_LOGIN_RESOLUTION_SECONDS` after the users' last refresh writes once per user; the "
                      "Go peer writes on every login): " + "; ".join(writes) + "."]
    components = bench.get("components", [])
    if components:
        lines += ["", "| component | throughput | p50 / p99 ms | broker peak RSS MiB |", "| --- | ---: | --- | ---: |"]
        for c in components:
            lines.append(f"| {c['name']} | {number(c['throughput_per_s'])} {c['unit']} | {c['p50_ms']} / {c['p99_ms']} | "
                         f"{c['broker_peak_rss_mib']} |")
    if bench.get("not_measured"):
        lines += ["", "Not measured in that run: " + ", ".join(bench["not_measured"]) + "."]
    return "\n".join(lines)


def reference_of(goal, bench):
    refs = bench.get("references", {})
    login = bench.get("details", {}).get("login", {})
    go = login.get("go_peer") or {}
    previous = login.get("previous_release") or {}
    if "Go peer" in goal:
        if "CPU" in goal:
            return (f"Go peer {number(go.get('peer_cpu_us_median'))} + {number(go.get('peer_postgres_cpu_us_median'))} µs "
                    f"against this build's {number(go.get('broker_cpu_us_median'))} + "
                    f"{number(go.get('broker_postgres_cpu_us_median'))} µs (medians)")
        if "p99" in goal:
            return f"Go peer {number(go.get('peer_p99_ms_median'), 1)} ms, this build {number(go.get('broker_p99_ms_median'), 1)} ms (medians)"
        return f"median of rounds {number(go.get('throughput_ratio_median'), 2)}×"
    if "regression" in goal:
        return (f"{previous.get('version')} (`{(previous.get('commit') or '')[:7]}`), same tokens and cluster; "
                f"throughput {number(previous.get('throughput_ratio_median'), 2)}× of it")
    if "pgbench on the same upsert" in goal:
        return f"pgbench {number(refs.get('pgbench_login_upsert_tps'))} tps"
    if "notifications" in goal:
        return f"pgbench {number(refs.get('pgbench_notification_apply_tps'))} tps"
    if "JWT" in goal:
        return (f"openssl speed {number(refs.get('openssl_rsa2048_verify_per_s'))}/s, the broker "
                f"{number(refs.get('broker_jwt_verify_per_s_per_core'))}/s")
    if "Glewlwyd" in goal:
        return "Glewlwyd 2.7 (Debian) on its own PostgreSQL"
    return ""


def main():
    source = sys.argv[1] if len(sys.argv) > 1 else "bench-results/bench.json"
    target = sys.argv[2] if len(sys.argv) > 2 else "docs/benchmarks.md"
    bench = json.load(open(source))
    text = open(target).read()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        sys.exit(f"{target} has no current-figures markers")
    text = text[:start] + BEGIN + "\n" + table(bench) + "\n" + text[end:]
    with open(target, "w") as handle:
        handle.write(text)
    print(f"written: the current figures of {target} (commit {bench.get('commit')}, {bench.get('taken_at')})")


if __name__ == "__main__":
    main()
