#!/usr/bin/env python3
"""make resilience: the whole system under steady mixed load while things break, then the
invariants that say nothing was lost.

Load (threads, for the whole run): logins with an authorization code, Apple notifications
(email-disabled / email-enabled, some account-delete) for users who signed in, deletions
of users who signed in, and the webhook deliveries all of these cause, to two receivers.

Faults, one after another:
  (a) the simulator fails 30% of token/revoke calls (500, 503, 429) and stalls some;
  (b) PostgreSQL is stopped hard (immediate shutdown, as on a crash) and restarted;
  (c) the broker is SIGKILLed and restarted, twice;
  (d) one webhook receiver is down for a while.

Invariants, checked against the database and what the receivers saw, printed one by one:
  1. every acknowledged login's identity exists (or its user was deleted on request);
  2. every acknowledged notification was applied exactly once (one inbox row, one audit
     row; replaying it afterwards is answered as a duplicate and changes nothing);
  3. every deletion request (ours and Apple's account-delete) reached `done` with its
     Apple revocation recorded;
  4. every event reached every subscriber (a delivered row per event and subscription,
     and the receiver saw that message id with a valid signature);
  5. no 5xx other than 503 (database or Apple unavailable) was ever answered.
Exits 1 if any invariant fails.

    python3 scripts/resilience.py --bin .build/release [--work DIR] [--load-seconds 75]
Uses only the standard library; PostgreSQL runs as its own cluster (not embedded) so that it
can be restarted under the broker.
"""

import argparse
import base64
import hashlib
import hmac
import http.server
import json
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request



def free_ports(count):
    """Ports nobody listens on now, so that two runs (or a run beside `make run`) never collide.
    All are held open together while picking, so the kernel hands out distinct ones."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


SIM_PORT, BROKER_PORT, RECEIVER_A, RECEIVER_B = free_ports(4)
RECEIVER_PORTS = (RECEIVER_A, RECEIVER_B)
# The cluster listens on a Unix socket in the run's own directory only: its port names the
# socket file and cannot collide with another run's.
PG_PORT = 5432
CLIENT_ID = "com.example.app"
START = time.monotonic()


def say(message):
    print(f"[{time.monotonic() - START:6.1f}s] {message}", flush=True)


# MARK: processes

class PostgresCluster:
    """A throwaway cluster on a unix socket in WORK, run as 'postgres' when we are root."""

    def __init__(self, work):
        self.data = os.path.join(work, "pg")
        self.socket_dir = os.path.join(work, "pgsock")
        self.log = os.path.join(self.data, "server.log")  # written by 'postgres' when we are root
        candidates = sorted(d for d in os.listdir("/usr/lib/postgresql") if d.isdigit()) if os.path.isdir("/usr/lib/postgresql") else []
        if not candidates:
            sys.exit("resilience: PostgreSQL server binaries not found under /usr/lib/postgresql (run scripts/bootstrap.sh test)")
        self.bin = f"/usr/lib/postgresql/{candidates[-1]}/bin"
        self.as_postgres = os.geteuid() == 0

    def run(self, *args, check=True):
        command = [os.path.join(self.bin, args[0]), *args[1:]]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True)

    def init(self):
        for path in (self.data, self.socket_dir):
            os.makedirs(path, exist_ok=True)
            if self.as_postgres:
                entry = pwd.getpwnam("postgres")
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self.run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        with open(os.path.join(self.data, "postgresql.conf"), "a") as conf:
            conf.write(f"listen_addresses = ''\nport = {PG_PORT}\nunix_socket_directories = '{self.socket_dir}'\n"
                       "fsync = on\nmax_connections = 200\n")

    def start(self):
        self.run("pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60", "start")

    def stop(self, mode="fast"):
        self.run("pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop", check=False)

    @property
    def url(self):
        return f"host={self.socket_dir} port={PG_PORT} user=postgres dbname=postgres"

    def query(self, sql):
        """Rows of a query as lists of strings (psql -At). The SQL goes through standard input:
        the invariant queries list every acknowledged sub and jti, which grows with the machine's
        speed, and one command-line argument is capped at 128 KiB."""
        result = subprocess.run(
            ["psql", "-h", self.socket_dir, "-p", str(PG_PORT), "-U", "postgres", "-d", "postgres", "-qAtX",
             "-F", "\t", "-v", "ON_ERROR_STOP=1", "-f", "-"],
            input=sql, check=True, capture_output=True, text=True)
        return [line.split("\t") for line in result.stdout.splitlines() if line]


def signing_key_and_cluster(work):
    """A fresh Sign in with Apple key (P-256, .p8) in WORK and a started cluster there."""
    key_path = os.path.join(work, "AuthKey.p8")
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key_path],
                   check=True, capture_output=True)
    postgres = PostgresCluster(work)
    postgres.init()
    postgres.start()
    return key_path, postgres


class Service:
    """A child process with its output in a log file."""

    def __init__(self, name, command, env, work):
        self.name, self.command, self.env = name, command, env
        self.log_path = os.path.join(work, f"{name}.log")
        self.process = None

    def start(self):
        log = open(self.log_path, "a")
        self.process = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def kill(self, sig=signal.SIGTERM):
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_http(url, seconds=180):  # a deadline: a loaded machine starts slower, never fails for it
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {url}")


def call(method, url, body=None, key=None, timeout=30):
    """(status, parsed JSON or None); status 0 when the connection failed."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            return response.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw)
        except ValueError:
            return error.code, None
    except (urllib.error.URLError, OSError):
        return 0, None


# MARK: webhook receivers

class Receiver:
    """Records the message ids of deliveries whose Standard Webhooks signature verifies."""

    def __init__(self, port):
        self.port = port
        self.secret = None
        self.seen = set()
        self.bad_signatures = 0
        self.lock = threading.Lock()
        self.server = None

    def start(self):
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                message_id = self.headers.get("webhook-id", "")
                signed = f"{message_id}.{self.headers.get('webhook-timestamp', '')}.".encode() + body
                expected = base64.b64encode(hmac.new(receiver.secret or b"", signed, hashlib.sha256).digest()).decode()
                signatures = [s.split(",", 1)[-1] for s in self.headers.get("webhook-signature", "").split()]
                with receiver.lock:
                    if expected in signatures:
                        receiver.seen.add(message_id)
                    else:
                        receiver.bad_signatures += 1
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.server.allow_reuse_address = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


# MARK: load

class Ledger:
    """What the broker acknowledged, and every status it answered."""

    def __init__(self):
        self.lock = threading.Lock()
        self.logins = {}            # apple sub -> user id
        self.notifications = {}     # jti -> signed payload
        self.deletions = {}         # deletion id -> apple sub
        self.deleted_subs = set()
        self.statuses = {}          # (operation, status) -> count
        self.server_errors = []     # (operation, status, problem code) for every 5xx

    def count(self, operation, status, problem=None):
        with self.lock:
            self.statuses[(operation, status)] = self.statuses.get((operation, status), 0) + 1
            if status >= 500:
                self.server_errors.append((operation, status, (problem or {}).get("code")))

    def live_sub(self):
        with self.lock:
            candidates = [s for s in self.logins if s not in self.deleted_subs]
            return random.choice(candidates) if candidates else None


def login_loop(stop, ledger, key):
    while not stop.is_set():
        status, minted = call("POST", f"http://127.0.0.1:{SIM_PORT}/sim/tokens", {"client_id": CLIENT_ID, "with_code": True})
        if status != 201:
            time.sleep(0.1)
            continue
        status, answer = call("POST", f"http://127.0.0.1:{BROKER_PORT}/v1/apple/login",
                              {"identity_token": minted["id_token"], "authorization_code": minted["code"]}, key)
        ledger.count("login", status, answer)
        if status == 200:
            with ledger.lock:
                ledger.logins[answer["apple_sub"]] = answer["user_id"]
        elif status == 0:
            time.sleep(0.2)


def notification_loop(stop, ledger):
    while not stop.is_set():
        sub = ledger.live_sub()
        if sub is None:
            time.sleep(0.1)
            continue
        kind = random.choices(["email-disabled", "email-enabled", "account-delete"], [45, 45, 10])[0]
        status, result = call("POST", f"http://127.0.0.1:{SIM_PORT}/sim/notifications", {
            "url": f"http://127.0.0.1:{BROKER_PORT}/v1/apple/notifications", "type": kind, "sub": sub, "client_id": CLIENT_ID})
        if status != 200:
            time.sleep(0.1)
            continue
        ledger.count("notification", result["status"])
        if result["status"] == 200:
            with ledger.lock:
                ledger.notifications[result["jti"]] = result["payload"]
                if kind == "account-delete":
                    ledger.deleted_subs.add(sub)
        elif result["status"] == 0:
            time.sleep(0.2)
        time.sleep(0.02)


def deletion_loop(stop, ledger, key):
    while not stop.is_set():
        time.sleep(0.15)
        sub = ledger.live_sub()
        if sub is None:
            continue
        status, answer = call("POST", f"http://127.0.0.1:{BROKER_PORT}/v1/deletions",
                              {"apple_sub": sub, "reason": "resilience", "requested_by": "resilience"}, key)
        ledger.count("deletion", status, answer)
        if status in (200, 201, 202):
            with ledger.lock:
                ledger.deletions[answer["deletion_id"]] = sub
                ledger.deleted_subs.add(sub)


# MARK: the run

def kill_and_restart(broker, number):
    say(f"(c) broker: SIGKILL, restarted ({number} of 2)")
    broker.kill(signal.SIGKILL)
    time.sleep(1)
    broker.start()
    wait_http(f"http://127.0.0.1:{BROKER_PORT}/readyz")
    say("    broker back")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True, help="directory holding appleid-broker and apple-sim")
    parser.add_argument("--work", help="a fresh directory of its own when not given")
    parser.add_argument("--load-seconds", type=int, default=75)
    parser.add_argument("--settle-seconds", type=int, default=240)
    parser.add_argument("--seed", type=int, default=37,
                        help="the load's random choices (which user, which notification); the simulator's faults are drawn "
                             "per call, and the invariants must hold for every draw")
    options = parser.parse_args()
    random.seed(options.seed)
    work = options.work or tempfile.mkdtemp(prefix="appleid-broker-resilience.")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.chmod(work, 0o755)

    key_path, postgres = signing_key_and_cluster(work)
    env = dict(os.environ)
    env.update({
        "APPLE_TEAM_ID": "RESILTEAM1", "APPLE_KEY_ID": "RESILKEY01", "APPLE_PRIVATE_KEY_PATH": key_path,
        "APPLE_CLIENT_IDS": CLIENT_ID, "APPLE_BASE_URL": f"http://127.0.0.1:{SIM_PORT}",
        "TOKEN_ENCRYPTION_KEY": base64.b64encode(os.urandom(32)).decode(),
        "DATABASE_URL": postgres.url, "BROKER_LISTEN": f"127.0.0.1:{BROKER_PORT}",
        "BROKER_LOG_LEVEL": "warning", "BROKER_ACCESS_LOG": "false",
        "BROKER_RATE_LIMIT_PER_KEY": "0", "BROKER_RATE_LIMIT_NOTIFICATIONS_PER_IP": "0", "BROKER_RATE_LIMIT_AUTH_FAILURES_PER_IP": "0",
        "BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true",
        # Retries come back quickly, so that the run settles within CI's time.
        "BROKER_WEBHOOK_RETRY_BASE_MS": "200", "BROKER_WEBHOOK_RETRY_MAX_SECONDS": "3",
        "BROKER_DELETION_RETRY_BASE_MS": "200", "BROKER_DELETION_RETRY_MAX_SECONDS": "3",
        "BROKER_DELETION_MAX_ATTEMPTS": "100", "BROKER_DB_ACQUIRE_TIMEOUT_MS": "2000",
        # A deletion claimed by a killed broker is taken up again when its lease runs out.
        "BROKER_DELETION_LEASE_SECONDS": "20",
    })
    simulator = Service("apple-sim", [
        os.path.join(options.bin, "apple-sim"), "serve", "--listen", f"127.0.0.1:{SIM_PORT}", "--team", "RESILTEAM1",
        "--key-id", "RESILKEY01", "--key", key_path, "--client-ids", CLIENT_ID], env, work)
    broker = Service("broker", [os.path.join(options.bin, "appleid-broker"), "serve"], env, work)
    receivers = [Receiver(port) for port in RECEIVER_PORTS]
    stop = threading.Event()
    threads = []
    failures = []
    try:
        simulator.start()
        wait_http(f"http://127.0.0.1:{SIM_PORT}/sim/stats")
        broker.start()
        wait_http(f"http://127.0.0.1:{BROKER_PORT}/readyz")
        key = subprocess.run([os.path.join(options.bin, "appleid-broker"), "api-keys", "create", "--name", "resilience",
                              "--scopes", "login,read,compliance,events,admin"], env=env, check=True,
                             capture_output=True, text=True).stdout.strip()
        subscriptions = {}
        for receiver in receivers:
            receiver.start()
            status, created = call("POST", f"http://127.0.0.1:{BROKER_PORT}/v1/webhook-subscriptions",
                                   {"url": f"http://127.0.0.1:{receiver.port}/hook", "topics": ["*"]}, key)
            assert status == 201, f"subscription: {status} {created}"
            receiver.secret = base64.b64decode(created["secret"].removeprefix("whsec_"))
            subscriptions[created["id"]] = receiver
        say(f"stack up: PostgreSQL {postgres.bin}, simulator :{SIM_PORT}, broker :{BROKER_PORT}, "
            f"receivers :{RECEIVER_PORTS[0]} :{RECEIVER_PORTS[1]}")

        ledger = Ledger()
        workers = [(login_loop, (stop, ledger, key)), (login_loop, (stop, ledger, key)),
                   (notification_loop, (stop, ledger)), (deletion_loop, (stop, ledger, key))]
        threads = [threading.Thread(target=target, args=args, daemon=True) for target, args in workers]
        for thread in threads:
            thread.start()
        say("mixed load running: 2 login loops, 1 notification loop, 1 deletion loop")

        step = options.load_seconds / 15
        time.sleep(step)
        say("(a) simulator: 30% of token/revoke calls fail (500/503/429), 5% stall 1.5 s, +20 ms on the rest")
        call("PUT", f"http://127.0.0.1:{SIM_PORT}/sim/faults", {
            "error_rate": 0.3, "timeout_rate": 0.05, "timeout_ms": 1500, "latency_ms": 20, "endpoints": ["token", "revoke"]})
        time.sleep(2 * step)
        say("(b) PostgreSQL: immediate shutdown (a crash), down for 5 s, restarted")
        postgres.stop("immediate")
        time.sleep(5)
        postgres.start()
        say("    PostgreSQL back")
        time.sleep(2 * step)
        kill_and_restart(broker, 1)
        time.sleep(step)
        say(f"(d) receiver :{receivers[1].port} down")
        receivers[1].stop()
        time.sleep(2 * step)
        kill_and_restart(broker, 2)
        time.sleep(2 * step)
        say(f"(d) receiver :{receivers[1].port} up again")
        receivers[1].start()
        time.sleep(2 * step)
        say("(a) simulator faults off")
        call("PUT", f"http://127.0.0.1:{SIM_PORT}/sim/faults", {})
        time.sleep(3 * step)
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        say(f"load stopped: {len(ledger.logins)} logins, {len(ledger.notifications)} notifications, "
            f"{len(ledger.deletions)} deletions acknowledged")

        # Let the broker finish what it acknowledged: deletions and deliveries.
        deadline = time.monotonic() + options.settle_seconds
        while time.monotonic() < deadline:
            open_work = postgres.query(
                "SELECT (SELECT count(*) FROM deletion_requests WHERE state NOT IN ('done', 'failed')),"
                " (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending')")[0]
            if open_work == ["0", "0"]:
                break
            time.sleep(1)
        say(f"settled: open deletions / pending deliveries = {'/'.join(open_work)}")

        # Replay every acknowledged notification: each must be answered as a duplicate.
        replayed_not_duplicate = 0
        for payload in ledger.notifications.values():
            status, answer = call("POST", f"http://127.0.0.1:{BROKER_PORT}/v1/apple/notifications", {"payload": payload})
            if status != 200 or (answer or {}).get("status") != "duplicate":
                replayed_not_duplicate += 1

        failures = check_invariants(postgres, ledger, receivers, subscriptions, replayed_not_duplicate)
    finally:
        stop.set()
        broker.kill()
        simulator.kill()
        for receiver in receivers:
            receiver.stop()
        postgres.stop("fast")
    if failures:
        print(f"resilience: {len(failures)} invariant(s) violated; logs in {work}", file=sys.stderr)
        sys.exit(1)
    print("resilience: every invariant holds")
    if not options.work:
        shutil.rmtree(work, ignore_errors=True)


def check_invariants(postgres, ledger, receivers, subscriptions, replayed_not_duplicate):
    failures = []

    def verdict(name, problems, figures):
        state = "ok  " if not problems else "FAIL"
        print(f"{state} {name}: {figures}")
        for problem in problems[:5]:
            print(f"       {problem}")
        if problems:
            failures.append(name)

    def in_list(values):
        return "(" + ",".join("'" + v.replace("'", "''") + "'" for v in values) + ")" if values else "(NULL)"

    print("\n== invariants")
    # 1. Logins.
    identities = {row[0]: row[1] for row in postgres.query(
        f"SELECT sub, user_id FROM apple_identities WHERE sub IN {in_list(list(ledger.logins))}")}
    deleted_users = {row[0] for row in postgres.query("SELECT user_id FROM deletion_requests WHERE state = 'done'")}
    missing = [f"sub {sub}: no identity and no finished deletion of user {user}"
               for sub, user in ledger.logins.items() if identities.get(sub) != user and user not in deleted_users]
    verdict("1. every acknowledged login's identity exists", missing,
            f"{len(ledger.logins)} acknowledged, {len(identities)} present, "
            f"{len(ledger.logins) - len(identities)} since deleted on request")

    # 2. Notifications, exactly once.
    jtis = list(ledger.notifications)
    inbox = {row[0]: int(row[1]) for row in postgres.query(
        f"SELECT jti, count(*) FROM apple_notifications WHERE jti IN {in_list(jtis)} GROUP BY jti")}
    audit = {row[0]: int(row[1]) for row in postgres.query(
        f"SELECT detail->>'jti', count(*) FROM audit_log WHERE actor = 'apple' AND detail->>'jti' IN {in_list(jtis)} "
        "GROUP BY 1")}
    problems = [f"jti {jti}: {inbox.get(jti, 0)} inbox rows, {audit.get(jti, 0)} audit rows"
                for jti in jtis if inbox.get(jti) != 1 or audit.get(jti) != 1]
    if replayed_not_duplicate:
        problems.append(f"{replayed_not_duplicate} replays were not answered as duplicates")
    outcomes = postgres.query(
        f"SELECT outcome, count(*) FROM apple_notifications WHERE jti IN {in_list(jtis)} GROUP BY 1 ORDER BY 1")
    verdict("2. every acknowledged notification applied exactly once", problems,
            f"{len(jtis)} acknowledged, replayed: all duplicates; outcomes "
            + ", ".join(f"{o} {c}" for o, c in outcomes))

    # 3. Deletions: ours and Apple's account-delete ones.
    # Ours revoke the user's refresh token at Apple; Apple's own (account-delete) record that
    # there is nothing to revoke, since Apple already invalidated the account's tokens.
    rows = postgres.query(
        "SELECT d.id, d.source, d.state, count(s.id) FILTER (WHERE (d.source <> 'apple' AND s.step = 'revoke'"
        "   AND s.outcome IN ('revoked', 'already_invalid')) OR (d.source = 'apple' AND s.step = 'revoke_skipped'))"
        " FROM deletion_requests d LEFT JOIN deletion_steps s ON s.deletion_id = d.id GROUP BY d.id, d.source, d.state")
    by_id = {row[0]: row for row in rows}
    # A token found alive, then dead when the attempt after a lost answer or a killed broker
    # checks it again: Apple may have ended it on our revoke, or a password change may have
    # (§12.3), and nothing tells the two apart, so the deletion rightly claims no revocation and
    # asks for the manual step. Allowed only with that history; any other manual step is a fault.
    unproven = {row[0] for row in postgres.query(
        "SELECT d.id FROM deletion_requests d WHERE d.apple_revocation = 'manual_required'"
        " AND EXISTS (SELECT 1 FROM deletion_steps s WHERE s.deletion_id = d.id AND s.step = 'check_token'"
        "   AND s.outcome = 'alive')"
        " AND EXISTS (SELECT 1 FROM deletion_steps s WHERE s.deletion_id = d.id AND s.step = 'check_token'"
        "   AND s.outcome = 'token_dead')")}
    problems = [f"deletion {d}: not found" for d in ledger.deletions if d not in by_id]
    problems += [f"deletion {row[0]} ({row[1]}): state {row[2]}, {row[3]} revocations recorded"
                 for row in rows if row[2] != "done" or (row[3] == "0" and row[0] not in unproven)]
    sources = {}
    for row in rows:
        sources[row[1]] = sources.get(row[1], 0) + 1
    revoke_attempts = postgres.query(
        "SELECT step || ' ' || outcome, count(*) FROM deletion_steps WHERE step LIKE 'revoke%' GROUP BY 1 ORDER BY 1")
    verdict("3. every deletion reached done with its revocation recorded", problems,
            f"{len(rows)} deletions ({', '.join(f'{s} {c}' for s, c in sorted(sources.items()))}), "
            f"{len(unproven)} left to the manual step after a lost answer; steps "
            + ", ".join(f"{o} {c}" for o, c in revoke_attempts))

    # 4. Events to every subscriber.
    events = [row[0] for row in postgres.query("SELECT id FROM outbox_events ORDER BY id")]
    delivered = {(row[0], row[1]) for row in postgres.query(
        "SELECT event_id, subscription_id FROM webhook_deliveries WHERE state = 'delivered'")}
    problems = []
    for subscription, receiver in subscriptions.items():
        compact = subscription.replace("-", "")
        for event in events:
            if (event, subscription) not in delivered:
                problems.append(f"event {event} not delivered to subscription {subscription}")
            elif f"msg_{event}_{compact}" not in receiver.seen:
                problems.append(f"event {event}: receiver :{receiver.port} never saw it")
        if receiver.bad_signatures:
            problems.append(f"receiver :{receiver.port}: {receiver.bad_signatures} deliveries with a bad signature")
    attempts = postgres.query("SELECT coalesce(sum(attempts), 0), count(*) FILTER (WHERE attempts > 1) FROM webhook_deliveries")[0]
    verdict("4. every event reached every subscriber", problems,
            f"{len(events)} events x {len(subscriptions)} subscribers; {attempts[0]} attempts, {attempts[1]} deliveries retried")

    # 5. No 5xx but 503.
    other = [e for e in ledger.server_errors if e[1] != 503]
    unavailable = {}
    for operation, status, code in ledger.server_errors:
        if status == 503:
            label = code or f"{operation} (code not seen)"
            unavailable[label] = unavailable.get(label, 0) + 1
    answered = sum(c for (_, s), c in ledger.statuses.items() if s != 0)
    unreachable = sum(c for (_, s), c in ledger.statuses.items() if s == 0)
    verdict("5. no 5xx other than 503", [f"{o}: {s} {c}" for o, s, c in other],
            f"{answered} answers, 503s by code: {unavailable or 'none'}; {unreachable} requests found the broker down")
    return failures


if __name__ == "__main__":
    main()
