"""Gathers the figures the benchmark scripts wrote into bench-results/ into one
bench.json (with the machine and commit, so runs can be compared), prints them as a table
with the goals, and draws bench.png: throughput and p50/p99 latency per component.

    python scripts/bench-report.py bench-results
A partial run (ONLY=crypto, or a benchmark that was not run) reports what was measured:
components without a result file are listed as not measured, and so are the goals that
need them. A goal not met is reported, not fatal (figures from a noisy machine are still
figures)."""

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone


class Missing(dict):
    """A result file that is not there: every figure read from it is None."""

    def __getitem__(self, key):
        return None

    def get(self, key, default=None):
        return default


def load(results, name):
    """A benchmark's figures, with the time they were written; Missing() when not measured."""
    path = os.path.join(results, f"{name}.json")
    try:
        with open(path) as handle:
            figures = json.load(handle)
    except FileNotFoundError:
        return Missing()
    figures["_written"] = datetime.fromtimestamp(os.path.getmtime(path), timezone.utc).isoformat(timespec="seconds")
    return figures


def ratio(numerator, denominator):
    return None if numerator is None or not denominator else numerator / denominator


def main():
    results = sys.argv[1]
    names = ("crypto", "login", "notifications", "deletion", "webhooks", "oidc")
    crypto, login, notifications, deletion, webhooks, oidc = (load(results, name) for name in names)
    missing = [name for name, figures in zip(names, (crypto, login, notifications, deletion, webhooks, oidc))
               if isinstance(figures, Missing)]
    components = [
        # name, throughput, unit, p50, p99, peak RSS, written at
        ("login", login["requests_per_second"], "logins/s", login["p50_ms"], login["p99_ms"], login["broker_peak_rss_mib"],
         login["_written"]),
        ("notifications", notifications["notifications_per_second"], "notifications/s", notifications["p50_ms"],
         notifications["p99_ms"], notifications["broker_peak_rss_mib"], notifications["_written"]),
        ("deletion", deletion["deletions_per_second"], "deletions/s", deletion["p50_ms"], deletion["p99_ms"],
         deletion["broker_peak_rss_mib"], deletion["_written"]),
        ("webhooks", webhooks["deliveries_per_second"], "deliveries/s", webhooks["p50_ms"], webhooks["p99_ms"],
         webhooks["broker_peak_rss_mib"], webhooks["_written"]),
    ]
    components = [c for c in components if c[1] is not None]
    ab = login.get("ab_throughput_ratio_vs_go_peer")
    peak_rss = max((c[5] for c in components if c[5] is not None), default=None)
    # (name, value, bound, at most?): the login's own (issue 39) as login.json judged them.
    goals = [(g["goal"], g["value"], g["bound"], g["at_most"]) for g in (login.get("goals") or [])] or [
        ("login against the Go peer and the previous release (issue 39)", None, None, False)]
    goals += [
        ("login >= 0.5 of pgbench on the same upsert",
         ratio(login["requests_per_second"], login["pgbench_same_upsert_tps"]), 0.5, False),
        ("notifications >= 0.6 of pgbench on the same apply", notifications["ratio_to_pgbench_apply"], 0.6, False),
        ("JWT verify >= 0.8 of openssl speed rsa2048, one core", crypto["ratio_to_openssl"], 0.8, False),
        ("broker peak RSS <= 100 MiB under load", peak_rss, 100, True),
        ("OIDC code exchanges >= 2x Glewlwyd per CPU-second", oidc["ratio_exchange_per_cpu_s"], 2.0, False),
    ]

    def met(goal):
        name, value, bound, at_most = goal
        if value is None:
            return None
        return value <= bound if at_most else value >= bound

    # CPU per request of the broker and of its PostgreSQL, from /proc, one line per kind of request.
    phases = login.get("phases") or {}
    broker_oidc = (oidc.get("sides") or {}).get("broker") or {}

    def per_request(name, broker_us, postgres_us, source):
        return {"request": name, "broker_us": broker_us, "postgres_us": postgres_us,
                "total_us": None if broker_us is None or postgres_us is None else broker_us + postgres_us, "source": source}

    def ms_to_us(value):
        return None if value is None else value * 1000

    cpu_per_request = [
        per_request(label, phases.get(kind, {}).get("broker_cpu_us_per_request"),
                    phases.get(kind, {}).get("postgres_cpu_us_per_request"), "bench-login, apple-sim")
        for kind, label in (("repeat_login", "repeat login"), ("first_login", "first login"),
                            ("code_exchange", "login with a code exchange (apple-sim's /auth/token)"))]
    cpu_per_request += [
        per_request("OpenID Provider: authorization (authorize, Apple's form post, our code)",
                    ms_to_us(broker_oidc.get("exchange_flow_cpu_ms_per_call")),
                    ms_to_us(broker_oidc.get("exchange_flow_db_cpu_ms_per_call")), "bench-oidc"),
        per_request("OpenID Provider: token endpoint (code exchange, PKCE)",
                    ms_to_us(broker_oidc.get("exchange_cpu_ms_per_call")),
                    ms_to_us(broker_oidc.get("exchange_db_cpu_ms_per_call")), "bench-oidc"),
        per_request("notification", notifications["broker_cpu_us_per_request"],
                    notifications["postgres_cpu_us_per_request"], "bench-notifications"),
    ]
    cpu_per_request = [row for row in cpu_per_request if row["broker_us"] is not None]

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = None
    summary = {
        "taken_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average": list(os.getloadavg())},
        "components": [
            {"name": c[0], "throughput_per_s": c[1], "unit": c[2], "p50_ms": c[3], "p99_ms": c[4], "broker_peak_rss_mib": c[5],
             "written_at": c[6]}
            for c in components],
        "not_measured": missing,
        "references": {
            "pgbench_login_upsert_tps": login["pgbench_same_upsert_tps"],
            "pgbench_notification_apply_tps": notifications["pgbench_same_apply_tps"],
            "pgbench_webhook_delivery_tps": webhooks["pgbench_same_delivery_tps"],
            "deletion_upper_bound_per_s": deletion["upper_bound_per_second"],
            "openssl_rsa2048_verify_per_s": crypto["openssl_rsa2048_verify_per_s"],
            "broker_jwt_verify_per_s_per_core": crypto["jwt_verify_per_s_per_core"],
            # The same ratio without the machine's drift: validation alternating with openssl
            # speed's own operation in one process (older crypto.json files lack it).
            "jwt_validate_to_openssl_speed_op_interleaved": crypto.get("validate_to_openssl_speed_op_interleaved"),
            "ab_throughput_ratio_vs_go_peer": ab,
            "ab_cpu_efficiency_ratio_vs_go_peer": login.get("ab_cpu_efficiency_ratio_vs_go_peer"),
            "oidc_exchange_ratio_vs_glewlwyd_per_cpu_s": oidc["ratio_exchange_per_cpu_s"],
            "oidc_exchange_ratio_vs_glewlwyd_per_cpu_s_with_postgres": oidc["ratio_exchange_per_cpu_s_with_db"],
            "oidc_userinfo_ratio_vs_glewlwyd_per_cpu_s": oidc["ratio_userinfo_per_cpu_s"],
        },
        "goals": [{"goal": g[0], "value": g[1], "bound": g[2], "at_most": g[3], "met": met(g)} for g in goals],
        "cpu_per_request": cpu_per_request,
        "login_ab": {"go_peer": login.get("go_peer"), "previous_release": login.get("previous_release")},
        "details": {name: figures for name, figures in zip(names, (crypto, login, notifications, deletion, webhooks, oidc))
                    if not isinstance(figures, Missing)},
    }
    with open(os.path.join(results, "bench.json"), "w") as handle:
        json.dump(summary, handle, indent=2)

    print(f"\n== appleid-broker benchmarks ({summary['taken_at']}, commit {commit}, {os.cpu_count()} CPUs)")
    print(f"{'component':<15}{'throughput':>12}  {'unit':<16}{'p50 ms':>9}{'p99 ms':>9}{'peak RSS MiB':>14}  measured at")
    for c in components:
        print(f"{c[0]:<15}{c[1]:>12.1f}  {c[2]:<16}{c[3]!s:>9}{c[4]!s:>9}{c[5]!s:>14}  {c[6]}")
    if missing:
        print(f"not measured (no result file in {results}): {', '.join(missing)}")
    refs = summary["references"]
    print(f"references: pgbench login upsert {refs['pgbench_login_upsert_tps']} tps, notification apply "
          f"{refs['pgbench_notification_apply_tps']} tps, webhook claim+record {refs['pgbench_webhook_delivery_tps']} tps; "
          f"openssl rsa2048 verify {refs['openssl_rsa2048_verify_per_s']}/s; broker JWT verify "
          f"{refs['broker_jwt_verify_per_s_per_core']}/s per core (drift-free, interleaved with openssl speed's "
          f"operation: {refs['jwt_validate_to_openssl_speed_op_interleaved']}); "
          f"deletion bound {refs['deletion_upper_bound_per_s']}/s; OIDC vs Glewlwyd per CPU-second: code exchanges "
          f"x{refs['oidc_exchange_ratio_vs_glewlwyd_per_cpu_s']} (x{refs['oidc_exchange_ratio_vs_glewlwyd_per_cpu_s_with_postgres']} "
          f"with PostgreSQL), userinfo x{refs['oidc_userinfo_ratio_vs_glewlwyd_per_cpu_s']}")
    if cpu_per_request:
        print("CPU per request (broker + its PostgreSQL, from /proc):")
        for row in cpu_per_request:
            total = "-" if row["total_us"] is None else f"{row['total_us']:.0f}"
            postgres = "-" if row["postgres_us"] is None else f"{row['postgres_us']:.0f}"
            print(f"  {row['request']:<72}{row['broker_us']:>8.0f} + {postgres:>6} = {total:>6} us")
    print("goals:")
    for goal in summary["goals"]:
        state = {True: "PASS", False: "FAIL", None: "FAIL (not measured)"}[goal["met"]]
        value = "-" if goal["value"] is None else f"{goal['value']:.2f}"
        print(f"{state}: {goal['goal']}: {value} (bound {goal['bound']})")

    if not components:
        print(f"written: {os.path.join(results, 'bench.json')} (no component figures: no chart)")
        return
    import matplotlib
    matplotlib.use("Agg")
    if not components:
        print(f"written: {os.path.join(results, 'bench.json')} (no component figures: no chart)")
        return
    import matplotlib.pyplot as plt

    names = [c[0] for c in components]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    bars = left.bar(names, [c[1] for c in components], color="#3b6ea5")
    left.bar_label(bars, labels=[f"{c[1]:.0f}" for c in components])
    left.set_title("Throughput (per second)")
    positions = range(len(components))
    right.bar([p - 0.2 for p in positions], [c[3] for c in components], width=0.4, label="p50", color="#7fa7d1")
    right.bar([p + 0.2 for p in positions], [c[4] for c in components], width=0.4, label="p99", color="#c0504d")
    right.set_xticks(list(positions), names)
    right.set_yscale("log")
    right.set_title("Latency (ms, log scale)")
    right.legend()
    figure.suptitle(f"appleid-broker {commit} on {os.cpu_count()} CPUs, {summary['taken_at']}")
    figure.tight_layout()
    figure.savefig(os.path.join(results, "bench.png"), dpi=110)
    print(f"written: {os.path.join(results, 'bench.json')}, {os.path.join(results, 'bench.png')}")


if __name__ == "__main__":
    main()
