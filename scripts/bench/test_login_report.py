"""How login_report.py judges the Go-peer A/B (make test runs this: `python3 -m unittest` in
scripts/bench). The logs are written in bench_http.sh's own format (../shared/peers), with the
`round host steal` line bench-login.sh appends per round; the report runs as bench-login.sh
calls it, and its login.json and PASS/FAIL lines are read back.

    python3 -m unittest discover -s scripts/bench -p 'test_*.py'
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "login_report.py")


def block(name, rate, server_us, postgres_us, p99_ms, steal=None, smoke="good->200 tampered->401"):
    """One server's round as bench_http.sh prints it."""
    lines = [
        f"== {name}  {smoke}  (server pid 4242)",
        "  Latency Distribution",
        "     50%    1.50ms",
        f"     99%    {p99_ms:.2f}ms",
        f"  {int(rate * 15)} requests in 15.00s, 10.00MB read",
        f"Requests/sec:  {rate:.2f}",
        f"   server CPU {server_us:.1f} us/req   postgres CPU {postgres_us:.1f} us/req",
        "   db: apple_users login_count +0 for 1 requests",
    ]
    if steal is not None:
        lines.append(f"   round host steal {steal}%")
    return "\n".join(lines) + "\n"


def ab_round(number, broker_rate, peer_rate, steal, broker_smoke="good->200 tampered->401", writes=None):
    """A round: the broker (150 µs per login, p99 4 ms) then the Go peer (400 µs, p99 8 ms); with
    `writes`, the broker's last_login_at writes bench-login.sh counts after the round."""
    return (block(f"A_service_r{number}", broker_rate, 100, 50, 4.0, steal, broker_smoke)
            + block(f"B_gopeer_r{number}", peer_rate, 300, 100, 8.0, steal)
            + ("" if writes is None else f"   broker last_login_at writes {writes}\n"))


class LoginReportJudging(unittest.TestCase):
    def report(self, log, rounds=3, steal_max=5):
        with tempfile.TemporaryDirectory() as work:
            with open(os.path.join(work, "ab.txt"), "w") as handle:
                handle.write(log)
            with open(os.path.join(work, "phases.jsonl"), "w") as handle:
                handle.write(json.dumps({"kind": "repeat_login", "requests_per_second": 9000, "p50_ms": 2.0,
                                         "p99_ms": 9.0, "non_2xx": 0, "broker_cpu_us_per_request": 100.0,
                                         "postgres_cpu_us_per_request": 40.0, "all_lines_used": False}) + "\n")
            run = subprocess.run(
                [sys.executable, REPORT, "--results", work, "--phases", os.path.join(work, "phases.jsonl"),
                 "--work", work, "--connections", "32", "--duration", "15s", "--tokens", "20000", "--rss", "35",
                 "--pgbench", "5000", "--go-peer-log", os.path.join(work, "ab.txt"), "--go-peer-steal", "1.0",
                 "--steal-max", str(steal_max), "--rounds", str(rounds)],
                capture_output=True, text=True, check=True)
            with open(os.path.join(work, "login.json")) as handle:
                return json.load(handle), run.stdout

    def test_a_stolen_round_is_kept_but_not_judged_when_enough_calm_rounds_remain(self):
        log = (ab_round(1, 9000, 4000, 0.3) + ab_round(2, 2600, 2200, 11.2)
               + ab_round(3, 8000, 4000, 0.5) + ab_round(4, 7000, 4000, 0.8))
        summary, output = self.report(log)
        go = summary["go_peer"]
        self.assertEqual([r["judged"] for r in go["rounds"]], [True, False, True, True])
        self.assertEqual(go["rounds_judged"], 3)
        self.assertAlmostEqual(go["throughput_ratio_min"], 1.75)  # round 4, not round 2's x1.18
        self.assertIn("not judged: steal over the bound", output)
        throughput = summary["goals"][1]
        self.assertTrue(throughput["met"])
        self.assertIn("host steal <= 5%", throughput["goal"])
        self.assertIn("PASS: throughput >= 1.5x", output)

    def test_every_valid_round_is_judged_when_too_few_were_calm(self):
        # Retakes ran out: two calm rounds of the three wanted, so the stolen one counts too.
        log = ab_round(1, 9000, 4000, 0.3) + ab_round(2, 2600, 2200, 11.2) + ab_round(3, 8000, 4000, 7.5) \
            + ab_round(4, 7000, 4000, 0.8)
        summary, output = self.report(log)
        go = summary["go_peer"]
        self.assertEqual([r["judged"] for r in go["rounds"]], [True, True, True, True])
        self.assertAlmostEqual(go["throughput_ratio_min"], 2600 / 2200)
        self.assertFalse(summary["goals"][1]["met"])
        self.assertNotIn("host steal <=", summary["goals"][1]["goal"])
        self.assertIn("FAIL: throughput >= 1.5x", output)

    def test_cpu_and_p99_goals_are_medians_of_the_judged_rounds(self):
        log = ab_round(1, 9000, 4000, 0.3) + ab_round(2, 9000, 4000, 0.4) + ab_round(3, 9000, 4000, 0.2)
        summary, _ = self.report(log)
        cpu, _, p99 = summary["goals"][:3]
        self.assertAlmostEqual(cpu["value"], 150 / 400)
        self.assertTrue(cpu["met"])
        self.assertAlmostEqual(p99["value"], 0.5)
        self.assertTrue(p99["met"])

    def test_each_round_carries_the_brokers_writes(self):
        log = ab_round(1, 9000, 4000, 0.3, writes=0) + ab_round(2, 7000, 4000, 0.2, writes=20000) \
            + ab_round(3, 9000, 4000, 0.4, writes=0)
        summary, output = self.report(log)
        self.assertEqual([r.get("broker_writes") for r in summary["go_peer"]["rounds"]], [0, 20000, 0])
        self.assertIn("x1.75, CPU 0.38, p99 0.50, host steal 0.2%, broker writes 20000", output)

    def test_a_round_that_failed_its_smoke_check_fails_the_throughput_goal(self):
        log = (ab_round(1, 9000, 4000, 0.3) + ab_round(2, 9000, 4000, 0.2, broker_smoke="good->500 tampered->401")
               + ab_round(3, 9000, 4000, 0.4))
        summary, output = self.report(log)
        go = summary["go_peer"]
        self.assertFalse(go["all_rounds_valid"])
        self.assertFalse(summary["goals"][1]["met"])
        self.assertIn("round 2: NOT VALID", output)


if __name__ == "__main__":
    unittest.main()
