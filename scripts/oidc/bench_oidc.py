"""The OpenID Provider's token and userinfo endpoints, whole sign-ins and prompt=none renewals
against Glewlwyd 2.7's, in one run on one
machine: interleaved rounds, each minting CODES authorization codes on each side by that
side's own authorize flow (the broker's through Apple's form post at the simulator, Glewlwyd's
through its login session), then exchanging them at the token endpoint with CONCURRENCY
keep-alive clients (PKCE S256, client_secret_basic, RS256 2048-bit ID tokens on both sides),
then USERINFO calls with the access tokens obtained; then CODES whole sign-ins (authorize, the
broker's trip to Apple or Glewlwyd's login, the callback, the code exchange) and CODES
prompt=none renewals from a live session (authorize answered at once, then the exchange), by
CONCURRENCY browsers at once (for Glewlwyd as CONCURRENCY users of its own, for the broker a
new person at Apple each whole sign-in). Throughput is per wall second and per
CPU-second of the server (utime+stime from /proc/PID/stat), also counting its PostgreSQL
(the postmaster and its backends; each side has its own cluster; with GLEWLWYD_DB=sqlite,
Glewlwyd's database is inside its process). The figure is the median over rounds of the
per-round ratio broker / Glewlwyd. Called by scripts/bench-oidc.sh.

    bench_oidc.py RESULTS_JSON   (configuration in the environment, see scripts/bench-oidc.sh)"""

import base64
import hashlib
import http.client
import json
import os
import secrets
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlencode, urlparse

import requests

from browser import browser_for

HZ = os.sysconf("SC_CLK_TCK")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CODES = int(os.environ.get("CODES", "200"))
CONCURRENCY = int(os.environ.get("CONCURRENCY", "8"))
USERINFO = int(os.environ.get("USERINFO", "2000"))
GLEWLWYD_DB = os.environ.get("GLEWLWYD_DB", "postgres")


def ticks(pids):
    total = 0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError):
            pass
    return total


def children(master):
    """The postmaster and its backends now (the broker's pool keeps its connections open)."""
    found = [master]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1] == str(master):
                    found.append(entry)
            except (OSError, IndexError):
                pass
    return found


def pkce():
    verifier = secrets.token_urlsafe(48)
    return verifier, base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


class Side:
    def __init__(self, name, issuer, client_id, secret, redirect_uri, pids, postmaster=None):
        self.name, self.issuer, self.client_id, self.secret = name, issuer.rstrip("/"), client_id, secret
        self.redirect_uri, self.pids, self.postmaster = redirect_uri, list(pids), postmaster
        meta = requests.get(self.issuer + "/.well-known/openid-configuration", timeout=10).json()
        self.authorization_endpoint = meta["authorization_endpoint"]
        self.token = urlparse(meta["token_endpoint"])
        self.token_url = meta["token_endpoint"]
        self.userinfo = urlparse(meta["userinfo_endpoint"])
        self.basic = "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()

    def authorize_url(self, challenge):
        return self.authorization_endpoint + "?" + urlencode({
            "response_type": "code", "client_id": self.client_id, "redirect_uri": self.redirect_uri,
            "scope": "openid", "state": secrets.token_hex(8), "nonce": secrets.token_hex(8),
            "code_challenge": challenge, "code_challenge_method": "S256"})

    def mint_one(self, person):
        verifier, challenge = pkce()
        callback = person.navigate(self.authorize_url(challenge), self.redirect_uri)
        assert isinstance(callback, str), f"{self.name}: authorize ended at {person.trail()}"
        return parse_qs(urlparse(callback).query)["code"][0], verifier

    def mint(self, count):
        local = threading.local()

        def one(_):
            if not hasattr(local, "person"):
                local.person = self.browser()
            return self.mint_one(local.person)

        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(one, range(count)))

    def browser(self, person=None):
        """A new browser; for Glewlwyd, signed in as its user number `person` (GLEWLWYD_EXTRA_USERS)."""
        username = f"{os.environ['GLEWLWYD_USER']}{person}" if person and self.name == "glewlwyd" else None
        return browser_for(self.issuer, self.name, username)


def run_parallel(items, call, connection_of):
    """Sends one request per item over CONCURRENCY keep-alive connections; returns the answers."""
    chunks = [items[i::CONCURRENCY] for i in range(CONCURRENCY)]
    results = [None] * CONCURRENCY

    def worker(index):
        connection = connection_of()
        answers = []
        for item in chunks[index]:
            answers.append(call(connection, item))
        connection.close()
        results[index] = answers

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(CONCURRENCY)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [answer for chunk in results for answer in chunk]


def measure(side, items, call, endpoint):
    db_pids = children(side.postmaster) if side.postmaster else []
    before, db_before, started = ticks(side.pids), ticks(db_pids), time.monotonic()
    answers = run_parallel(items, call, lambda: http.client.HTTPConnection(endpoint.hostname, endpoint.port, timeout=30))
    elapsed = time.monotonic() - started
    cpu = (ticks(side.pids) - before) / HZ
    db_cpu = (ticks(db_pids) - db_before) / HZ
    failed = [answer for answer in answers if answer[0] != 200]
    # Glewlwyd on sqlite fails the odd exchange under concurrency ("Error executing j_query",
    # the database busy): counted and reported, only answered requests count as done.
    assert len(failed) * 20 <= len(answers), f"{side.name}: {len(failed)} of {len(answers)} requests failed, e.g. {failed[0]}"
    count = len(items) - len(failed)
    return {"per_s": count / elapsed, "per_cpu_s": count / cpu if cpu else None, "failed": len(failed),
            "per_cpu_s_with_db": count / (cpu + db_cpu) if cpu + db_cpu else None,
            "cpu_ms_per_call": 1000 * cpu / count, "db_cpu_ms_per_call": 1000 * db_cpu / count}, answers


def exchange_round(side):
    # The authorization half of the code flow (authorize, Apple's form post at the callback
    # with its own code exchange at the simulator, the redirect with our code): CPU per code.
    db_pids = children(side.postmaster) if side.postmaster else []
    before, db_before = ticks(side.pids), ticks(db_pids)
    codes = side.mint(CODES)
    flow = {"flow_cpu_ms_per_call": 1000 * (ticks(side.pids) - before) / HZ / len(codes),
            "flow_db_cpu_ms_per_call": 1000 * (ticks(db_pids) - db_before) / HZ / len(codes)}

    def call(connection, item):
        code, verifier = item
        body = urlencode({"grant_type": "authorization_code", "code": code, "redirect_uri": side.redirect_uri,
                          "code_verifier": verifier})
        connection.request("POST", side.token.path, body, {
            "Authorization": side.basic, "Content-Type": "application/x-www-form-urlencoded"})
        response = connection.getresponse()
        data = response.read()
        return response.status, (json.loads(data).get("access_token") if response.status == 200 else data[:200])

    figures, answers = measure(side, codes, call, side.token)
    figures.update(flow)
    return figures, [token for status, token in answers if status == 200]


def measure_flows(side, phase, count, prepare, flow):
    """`count` sign-ins by CONCURRENCY browsers at once, each browser made by `prepare` (not
    measured) and then running `flow(browser)` for its share; the server's CPU (and its
    database's) over the flows alone. The simulator's CPU (Apple's side) is not counted."""
    browsers = [prepare(index + 1) for index in range(CONCURRENCY)]
    shares = [count // CONCURRENCY + (1 if i < count % CONCURRENCY else 0) for i in range(CONCURRENCY)]
    results = [[] for _ in range(CONCURRENCY)]
    db_pids = children(side.postmaster) if side.postmaster else []
    before, db_before, started = ticks(side.pids), ticks(db_pids), time.monotonic()

    def worker(index):
        for _ in range(shares[index]):
            try:
                results[index].append(flow(browsers[index], index + 1))
            except (AssertionError, KeyError, requests.RequestException) as error:
                results[index].append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(CONCURRENCY)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    cpu, db_cpu = (ticks(side.pids) - before) / HZ, (ticks(db_pids) - db_before) / HZ
    failed = [r for chunk in results for r in chunk if not isinstance(r, str)]
    # Glewlwyd answers the odd exchange of a code from a brand-new login session invalid_code
    # when several logins of its one user run at once (about 1 in 15 at concurrency 8): failures
    # are counted and reported; only completed sign-ins count. A broken setup still stops here.
    if failed:
        print(f"{side.name} {phase}: {len(failed)} of {count} failed, e.g. {failed[0]!r}", flush=True)
    assert len(failed) * 4 <= count, f"{side.name} {phase}: {len(failed)} of {count} sign-ins failed, e.g. {failed[0]!r}"
    done = count - len(failed)
    return {"per_s": done / elapsed, "per_cpu_s": done / cpu if cpu else None, "failed": len(failed),
            "per_cpu_s_with_db": done / (cpu + db_cpu) if cpu + db_cpu else None,
            "cpu_ms_per_call": 1000 * cpu / done, "db_cpu_ms_per_call": 1000 * db_cpu / done}


def exchange(side, browser, code, verifier):
    answer = browser.session.post(side.token_url, timeout=30, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": side.redirect_uri, "code_verifier": verifier},
        headers={"Authorization": side.basic})
    assert answer.status_code == 200, f"{side.name}: token {answer.status_code} {answer.text[:200]}"
    return answer.json()


def full_flow_round(side):
    """The whole sign-in: the broker's through Apple (the simulator, a new person each time),
    Glewlwyd's with its own login (a new session each time); then the code exchange."""
    def flow(_, number):
        person = side.browser(number)
        code, verifier = side.mint_one(person)
        return exchange(side, person, code, verifier)["access_token"]
    return measure_flows(side, "whole sign-ins", CODES, lambda _: None, flow)


def renewal_round(side):
    """Silent renewal as an RP does it: prompt=none with the last ID token as id_token_hint
    (Glewlwyd requires one) and a live session at the provider (no trip to Apple for the
    broker, no login for Glewlwyd), then the code exchange. Each browser signs in once first
    (not measured)."""
    def prepare(number):
        person = side.browser(number)
        code, verifier = side.mint_one(person)
        person.id_token = exchange(side, person, code, verifier)["id_token"]
        return person

    def flow(person, _):
        verifier, challenge = pkce()
        hint = urlencode({"prompt": "none", "id_token_hint": person.id_token})
        callback = person.navigate(side.authorize_url(challenge) + "&" + hint, side.redirect_uri)
        assert isinstance(callback, str), f"{side.name}: prompt=none ended at {person.trail()[-300:]}"
        query = parse_qs(urlparse(callback).query)
        assert "code" in query, f"{side.name}: prompt=none answered {query}"
        tokens = exchange(side, person, query["code"][0], verifier)
        # The RP keeps the newest ID token for its next renewal (Glewlwyd takes only the last one).
        person.id_token = tokens["id_token"]
        return tokens["access_token"]
    return measure_flows(side, "prompt=none renewals", CODES, prepare, flow)


def userinfo_round(side, tokens):
    calls = [tokens[i % len(tokens)] for i in range(USERINFO)]

    def call(connection, token):
        connection.request("GET", side.userinfo.path, headers={"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        data = response.read()
        return response.status, data[:200]

    return measure(side, calls, call, side.userinfo)[0]


def main():
    out = sys.argv[1]
    sides = [Side("glewlwyd", os.environ["GLEWLWYD_ISSUER"], os.environ["GLEWLWYD_CLIENT_ID"],
                  os.environ["GLEWLWYD_CLIENT_SECRET"], os.environ["GLEWLWYD_REDIRECT_URI"],
                  [os.environ["GLEWLWYD_PID"]], os.environ.get("GLEWLWYD_POSTMASTER_PID") or None)]
    if os.environ.get("BROKER_ISSUER"):
        sides.append(Side("broker", os.environ["BROKER_ISSUER"], os.environ["BROKER_CLIENT_ID"],
                          os.environ["BROKER_CLIENT_SECRET"], os.environ["BROKER_REDIRECT_URI"],
                          [os.environ["BROKER_SERVER_PID"]], os.environ.get("BROKER_POSTMASTER_PID")))
    rounds = []
    for number in range(1, ROUNDS + 1):
        # Alternate which side goes first, so neither always meets a warmer or cooler machine.
        order = sides if number % 2 else list(reversed(sides))
        row = {}
        for side in order:
            exchanged, tokens = exchange_round(side)
            row[side.name] = {"exchange": exchanged, "userinfo": userinfo_round(side, tokens),
                              "full_flow": full_flow_round(side), "renewal": renewal_round(side)}
        rounds.append(row)
        print(f"round {number}: " + "   ".join(
            f"{name}: {figures['exchange']['per_s']:.0f} exchanges/s ({figures['exchange']['per_cpu_s']:.0f}/CPU-s, "
            f"{figures['exchange']['per_cpu_s_with_db']:.0f} with its database), "
            f"{figures['userinfo']['per_s']:.0f} userinfo/s ({figures['userinfo']['per_cpu_s']:.0f}/CPU-s), "
            f"full sign-ins {figures['full_flow']['per_s']:.0f}/s ({figures['full_flow']['per_cpu_s']:.0f}/CPU-s), "
            f"prompt=none renewals {figures['renewal']['per_s']:.0f}/s ({figures['renewal']['per_cpu_s']:.0f}/CPU-s)"
            for name, figures in row.items()), flush=True)

    def median(name, kind, key):
        values = [r[name][kind].get(key) for r in rounds if r[name][kind].get(key) is not None]
        return statistics.median(values) if values else None

    def ratio(kind, key):
        if len(sides) < 2:
            return None
        values = [r["broker"][kind][key] / r["glewlwyd"][kind][key] for r in rounds
                  if r["broker"][kind][key] and r["glewlwyd"][kind][key]]
        return round(statistics.median(values), 3) if values else None

    summary = {"benchmark": "oidc", "rounds": ROUNDS, "codes_per_round": CODES, "concurrency": CONCURRENCY,
               "userinfo_calls_per_round": USERINFO, "reference": f"Glewlwyd 2.7 (Debian), {GLEWLWYD_DB}, RS256 2048",
               "sides": {side.name: {f"{kind}_{key}": median(side.name, kind, key)
                                     for kind in ("exchange", "userinfo", "full_flow", "renewal")
                                     for key in ("per_s", "per_cpu_s", "per_cpu_s_with_db", "cpu_ms_per_call",
                                                 "db_cpu_ms_per_call", "flow_cpu_ms_per_call", "flow_db_cpu_ms_per_call")
                                     if kind == "exchange" or not key.startswith("flow")}
                         for side in sides},
               "ratio_exchange_per_s": ratio("exchange", "per_s"),
               "ratio_exchange_per_cpu_s": ratio("exchange", "per_cpu_s"),
               "ratio_exchange_per_cpu_s_with_db": ratio("exchange", "per_cpu_s_with_db"),
               "ratio_userinfo_per_s": ratio("userinfo", "per_s"),
               "ratio_userinfo_per_cpu_s": ratio("userinfo", "per_cpu_s"),
               "ratio_userinfo_per_cpu_s_with_db": ratio("userinfo", "per_cpu_s_with_db"),
               "ratio_full_flow_per_cpu_s": ratio("full_flow", "per_cpu_s"),
               "ratio_full_flow_per_cpu_s_with_db": ratio("full_flow", "per_cpu_s_with_db"),
               "ratio_renewal_per_cpu_s": ratio("renewal", "per_cpu_s"),
               "ratio_renewal_per_cpu_s_with_db": ratio("renewal", "per_cpu_s_with_db"),
               "failed_requests": {side.name: sum(r[side.name][kind]["failed"] for r in rounds
                                                  for kind in ("exchange", "userinfo", "full_flow", "renewal"))
                                   for side in sides},
               "round_figures": rounds}
    with open(out, "w") as handle:
        json.dump(summary, handle, indent=1)
    for name, figures in summary["sides"].items():
        print(f"median {name}: {figures['exchange_per_s']:.0f} code exchanges/s, {figures['exchange_per_cpu_s']:.0f} "
              f"per server CPU-second ({figures['exchange_per_cpu_s_with_db']:.0f} counting its database); "
              f"userinfo {figures['userinfo_per_s']:.0f}/s, {figures['userinfo_per_cpu_s']:.0f} per CPU-second; "
              f"full sign-ins {figures['full_flow_per_s']:.0f}/s, {figures['full_flow_per_cpu_s']:.0f} per CPU-second "
              f"({figures['full_flow_per_cpu_s_with_db']:.0f} with its database); prompt=none renewals "
              f"{figures['renewal_per_s']:.0f}/s, {figures['renewal_per_cpu_s']:.0f} per CPU-second "
              f"({figures['renewal_per_cpu_s_with_db']:.0f} with its database); "
              f"{summary['failed_requests'][name]} requests failed in all")
    if len(sides) == 2:
        print(f"broker / Glewlwyd (median of per-round ratios): code exchanges x{summary['ratio_exchange_per_s']} per "
              f"second, x{summary['ratio_exchange_per_cpu_s']} per CPU-second of the server process "
              f"(x{summary['ratio_exchange_per_cpu_s_with_db']} "
              f"counting each side's database, Glewlwyd on {GLEWLWYD_DB}); userinfo x{summary['ratio_userinfo_per_s']} "
              f"per second, x{summary['ratio_userinfo_per_cpu_s']} per CPU-second "
              f"(x{summary['ratio_userinfo_per_cpu_s_with_db']} with the databases); full sign-ins "
              f"x{summary['ratio_full_flow_per_cpu_s']} per CPU-second (x{summary['ratio_full_flow_per_cpu_s_with_db']} with "
              f"the databases); prompt=none renewals x{summary['ratio_renewal_per_cpu_s']} per CPU-second "
              f"(x{summary['ratio_renewal_per_cpu_s_with_db']} with the databases). Goal: >= 2 per CPU-second")
    else:
        print("broker side not measured (BROKER_ISSUER unset): no ratio")


if __name__ == "__main__":
    main()
