#!/usr/bin/env python3
"""The previous release and this build side by side on one database, as in a rolling upgrade
(issue 29 item 6). Called by scripts/rolling-upgrade.sh, which builds both.

  1. The previous release migrates a fresh database and starts (API, notifications, dispatch).
  2. This build starts on the same database: it migrates and applies sql/functions/.
     The catalog (sql/catalog/describe.sql) of that upgraded database must equal the catalog of
     a fresh database this build migrated, and every function, column, index and constraint the
     previous release had must still be there unchanged (expand: nothing replaced in place).
  3. Both brokers, each on its own port, are driven: a new user's and a known user's login, an
     Apple notification, a consent-revoked older than the last sign-in arriving late at each
     (stale on both: issue 35's timeline), a deletion (the deletion job and the refresh sweep of each release,
     one release at a time, so each is seen working), and every webhook event delivered.
Every answer is checked; exits 1 on the first wrong one, with the logs' tails.

    python3 scripts/rolling-upgrade.py --previous DIR --current DIR [--write-catalog FILE]
"""

import argparse
import base64
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resilience import Receiver, Service, call, free_ports, signing_key_and_cluster, wait_http  # noqa: E402

CLIENT_ID = "com.example.app"
TEAM = "UPGRADE001"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START = time.monotonic()


def say(message):
    print(f"[{time.monotonic() - START:6.1f}s] {message}", flush=True)


class Failed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failed(message)


def eventually(what, probe, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise Failed(f"timed out: {what}")


def catalog(postgres, database):
    query = open(os.path.join(ROOT, "sql/catalog/describe.sql")).read()
    result = subprocess.run(
        ["psql", "-h", postgres.socket_dir, "-p", "5432", "-U", "postgres", "-d", database, "-qAtX", "-v", "ON_ERROR_STOP=1",
         "-f", "-"], input=query, check=True, capture_output=True, text=True)
    return result.stdout.splitlines()


class Broker:
    def __init__(self, name, bin_dir, env, work, port, workers_port):
        self.name, self.bin = name, bin_dir
        self.port, self.workers_port = port, workers_port
        self.env = dict(env, BROKER_LISTEN=f"127.0.0.1:{self.port}")
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = Service(f"{name}-api", [os.path.join(bin_dir, "appleid-broker"), "serve", "--roles",
                                           "api,notifications,dispatch"], self.env, work)
        self.work = work

    def cli(self, *args, **env):
        return subprocess.run([os.path.join(self.bin, "appleid-broker"), *args], env=dict(self.env, **env), check=True,
                              capture_output=True, text=True).stdout.strip()

    def workers(self):
        """The deletion job and the refresh sweep of this release, on a port of their own."""
        port = self.workers_port
        return Service(f"{self.name}-workers", [os.path.join(self.bin, "appleid-broker"), "serve", "--roles", "deletion,sweep"],
                       dict(self.env, BROKER_LISTEN=f"127.0.0.1:{port}"), self.work), f"http://127.0.0.1:{port}"


def login(sim, broker, key, sub=None):
    request = {"client_id": CLIENT_ID, "with_code": True}
    if sub:
        request["sub"] = sub
    status, minted = call("POST", f"{sim}/sim/tokens", request)
    check(status == 201, f"simulator: mint a token: {status} {minted}")
    return call("POST", f"{broker.url}/v1/apple/login",
                {"identity_token": minted["id_token"], "authorization_code": minted["code"]}, key)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--previous", required=True, help="directory holding the previous release's appleid-broker")
    parser.add_argument("--current", required=True, help="directory holding this build's appleid-broker and apple-sim")
    parser.add_argument("--write-catalog", help="write the upgraded database's catalog here (sql/catalog/expected.txt)")
    options = parser.parse_args()
    work = tempfile.mkdtemp(prefix="appleid-broker-upgrade.")
    os.chmod(work, 0o755)
    key_path, postgres = signing_key_and_cluster(work)
    sim_port, receiver_port, *broker_ports = free_ports(6)
    sim = f"http://127.0.0.1:{sim_port}"
    env = dict(os.environ)
    env.update({
        "APPLE_TEAM_ID": TEAM, "APPLE_KEY_ID": "UPGRADEK01", "APPLE_PRIVATE_KEY_PATH": key_path,
        "APPLE_CLIENT_IDS": CLIENT_ID, "APPLE_BASE_URL": sim,
        "TOKEN_ENCRYPTION_KEY": base64.b64encode(os.urandom(32)).decode(),
        "DATABASE_URL": postgres.url, "BROKER_LOG_LEVEL": "warning", "BROKER_ACCESS_LOG": "false",
        "BROKER_WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true", "BROKER_SWEEP_INTERVAL_SECONDS": "1",
        "BROKER_WEBHOOK_RETRY_BASE_MS": "200", "BROKER_WEBHOOK_RETRY_MAX_SECONDS": "2",
        "BROKER_DELETION_RETRY_BASE_MS": "200", "BROKER_DELETION_RETRY_MAX_SECONDS": "2",
    })
    simulator = Service("apple-sim", [os.path.join(options.current, "apple-sim"), "serve", "--listen", f"127.0.0.1:{sim_port}",
                                      "--team", TEAM, "--key-id", "UPGRADEK01", "--key", key_path, "--client-ids", CLIENT_ID],
                        env, work)
    old = Broker("previous", options.previous, env, work, *broker_ports[0:2])
    new = Broker("current", options.current, env, work, *broker_ports[2:4])
    receiver = Receiver(receiver_port)
    services = [simulator, old.api, new.api]
    succeeded = False
    try:
        simulator.start()
        wait_http(f"{sim}/sim/stats")

        say("1. the previous release migrates a fresh database and starts")
        old.cli("migrate")
        previous_catalog = catalog(postgres, "postgres")
        old.api.start()
        wait_http(f"{old.url}/readyz")
        key = old.cli("api-keys", "create", "--name", "upgrade", "--scopes", "login,read,compliance,events,admin")
        receiver.start()
        status, created = call("POST", f"{old.url}/v1/webhook-subscriptions",
                               {"url": f"http://127.0.0.1:{receiver_port}/hook", "topics": ["*"]}, key)
        check(status == 201, f"previous: webhook subscription: {status} {created}")
        receiver.secret = base64.b64decode(created["secret"].removeprefix("whsec_"))
        status, first = login(sim, old, key)
        check(status == 200 and first["is_new_user"], f"previous, before the upgrade: new user's login: {status} {first}")

        say("2. this build starts on the same database (migrations, sql/functions/)")
        new.api.start()
        wait_http(f"{new.url}/readyz", seconds=120)
        upgraded = catalog(postgres, "postgres")
        subprocess.run(["psql", "-h", postgres.socket_dir, "-U", "postgres", "-qAtX", "-c", "CREATE DATABASE fresh"],
                       check=True, capture_output=True)
        new.cli("migrate", DATABASE_URL=postgres.url.replace("dbname=postgres", "dbname=fresh"))
        fresh = catalog(postgres, "fresh")
        if options.write_catalog:
            with open(options.write_catalog, "w") as out:
                out.write("\n".join(upgraded) + "\n")
            say(f"   wrote {options.write_catalog}")
        check(upgraded == fresh, "the upgraded database and a fresh one differ:\n  upgraded only: "
              + "\n  ".join(sorted(set(upgraded) - set(fresh))) + "\n  fresh only: " + "\n  ".join(sorted(set(fresh) - set(upgraded))))
        gone = sorted(set(previous_catalog) - set(upgraded))
        check(not gone, "the upgrade changed or removed what the previous release has (expand/contract):\n  " + "\n  ".join(gone))
        say(f"   catalogs: upgraded == fresh ({len(fresh)} lines), nothing of the previous release's changed")

        say("3. both brokers, side by side")
        users = {}  # sub -> user id
        users[first["apple_sub"]] = first["user_id"]
        for broker in (old, new):
            status, answer = login(sim, broker, key)
            check(status == 200 and answer["is_new_user"] and answer["refresh_token_stored"],
                  f"{broker.name}: new user's login: {status} {answer}")
            users[answer["apple_sub"]] = answer["user_id"]
            for sub, user in list(users.items()):
                status, again = login(sim, broker, key, sub)
                check(status == 200 and not again["is_new_user"] and again["user_id"] == user,
                      f"{broker.name}: known user's login ({sub}): {status} {again}")
            say(f"   {broker.name}: logins of a new user and of {len(users)} known users")
        for broker, sub in ((old, list(users)[1]), (new, list(users)[2])):
            status, sent = call("POST", f"{sim}/sim/notifications", {
                "url": f"{broker.url}/v1/apple/notifications", "type": "email-disabled", "sub": sub, "client_id": CLIENT_ID})
            check(status == 200 and sent["status"] == 200, f"{broker.name}: notification: {status} {sent}")
            say(f"   {broker.name}: email-disabled notification applied")
        # Apple's clock (issue 35): a consent-revoked from before the user's last sign-in (this
        # build's, on the timeline) arrives late at each release: both record it stale, revoke
        # nothing (v0.24.0 through consent_at, which this build's sign-ins advance).
        late_sub = list(users)[2]
        for broker in (old, new):
            status, sent = call("POST", f"{sim}/sim/notifications", {
                "url": f"{broker.url}/v1/apple/notifications", "type": "consent-revoked", "sub": late_sub,
                "client_id": CLIENT_ID, "event_time_ms": int((time.time() - 60) * 1000)})
            check(status == 200 and sent["status"] == 200, f"{broker.name}: late consent-revoked: {status} {sent}")
            outcome = postgres.query(f"SELECT outcome FROM apple_notifications WHERE jti = '{sent['jti']}'")[0][0]
            check(outcome == "stale", f"{broker.name}: a consent-revoked older than the last sign-in was {outcome}")
        check(postgres.query("SELECT count(*) FROM outbox_events WHERE type = 'consent.revoked'")[0][0] == "0",
              "a late consent-revoked revoked a user who signed in after it")
        say("   previous and current: a late consent-revoked from before the last sign-in is stale on both")
        deletions = []
        for broker, sub in ((old, list(users)[0]), (new, list(users)[1])):
            workers, workers_url = broker.workers()
            services.append(workers)
            workers.start()
            wait_http(f"{workers_url}/readyz", seconds=120)
            status, deletion = call("POST", f"{broker.url}/v1/deletions",
                                    {"apple_sub": sub, "reason": "upgrade", "requested_by": "rolling-upgrade"}, key)
            check(status == 202 and deletion["created"], f"{broker.name}: deletion: {status} {deletion}")
            for reader in (old, new):
                done = eventually(f"{broker.name}'s deletion done, read through {reader.name}", lambda: next(
                    (d for d in [call("GET", f"{reader.url}/v1/deletions/{deletion['deletion_id']}", key=key)[1] or {}]
                     if d.get("state") == "done"), None))
                check(done.get("apple_revocation") == "revoked", f"{broker.name}'s deletion, read through {reader.name}: {done}")
            deletions.append(deletion["deletion_id"])
            # The sweep: the remaining users' tokens due now, validated at the simulator by this release.
            postgres.query("UPDATE apple_tokens SET next_validation_at = now(), last_validated_at = NULL")
            eventually(f"{broker.name}'s refresh sweep", lambda: postgres.query(
                "SELECT count(*) FROM apple_tokens WHERE last_validated_at IS NULL")[0][0] == "0")
            workers.kill()
            say(f"   {broker.name}: a deletion done (revoked at Apple, purged), the refresh sweep validated every token")
        status, gone_login = login(sim, old, key, list(users)[0])
        check(status == 200 and gone_login["is_new_user"], f"previous: a deleted user signs in again as new: {status} {gone_login}")

        expected = int(postgres.query("SELECT count(*) FROM outbox_events")[0][0])
        eventually("every event delivered", lambda: len(receiver.seen) >= expected, seconds=90)
        check(receiver.bad_signatures == 0, f"{receiver.bad_signatures} deliveries with a bad signature")
        say(f"   {expected} events delivered with valid signatures")
        say("rolling upgrade: every answer right on both releases")
        succeeded = True
        return 0
    except Failed as failure:
        print(f"rolling-upgrade: FAILED: {failure}", file=sys.stderr)
        for service in services:
            if os.path.exists(service.log_path):
                print(f"--- {service.log_path} (tail)", file=sys.stderr)
                print("".join(open(service.log_path).readlines()[-15:]), file=sys.stderr)
        return 1
    finally:
        for service in reversed(services):
            service.kill()
        receiver.stop()
        postgres.stop()
        # Kept when something failed: the logs are there.
        if succeeded:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
