#!/usr/bin/env python3
"""A minimal app-backend webhook receiver for appleid-broker (Python standard library only).

It subscribes itself to the broker's events, then verifies and prints every delivery the
way an app backend should: check the Standard Webhooks signature over
"{webhook-id}.{webhook-timestamp}.{body}" with the subscription's secret, refuse stale
timestamps, and deduplicate on webhook-id (deliveries are at least once).

    python3 examples/webhook_receiver.py --broker http://127.0.0.1:8080 --key "$KEY"

--exit-after TYPE stops after the first event of that type (the README's tour uses it);
--ready-file PATH is written once the subscription exists; --record FILE appends each
verified delivery (headers and body) as a JSON line. For production prefer the official
Standard Webhooks library (`pip install standardwebhooks`; also npm, Go, Java, Ruby, PHP,
Rust, C#): https://github.com/standard-webhooks/standard-webhooks
"""
import argparse
import base64
import hashlib
import hmac
import http.server
import json
import sys
import time
import urllib.request

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--broker", default="http://127.0.0.1:8080", help="the broker's base URL")
parser.add_argument("--key", required=True, help="an API key with the admin scope")
parser.add_argument("--port", type=int, default=9000, help="port to listen on (127.0.0.1)")
parser.add_argument("--topics", default="*", help="comma-separated topics (default: all)")
parser.add_argument("--exit-after", help="stop after the first event of this type")
parser.add_argument("--ready-file", help="write this file once subscribed")
parser.add_argument("--record", help="append each verified delivery to this file (JSON lines)")
args = parser.parse_args()


def broker(method, path, body=None):
    request = urllib.request.Request(
        args.broker + path, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": "Bearer " + args.key, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response) if response.status != 204 else None


subscription = broker("POST", "/v1/webhook-subscriptions", {
    "url": f"http://127.0.0.1:{args.port}/hooks/appleid",
    "topics": args.topics.split(","),
    "description": "examples/webhook_receiver.py"})
secret = base64.b64decode(subscription["secret"].removeprefix("whsec_"))
print(f"subscribed {subscription['id']} to {','.join(subscription['topics'])}", flush=True)
seen = set()
done = False


class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        global done
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        webhook_id = self.headers.get("webhook-id", "")
        timestamp = self.headers.get("webhook-timestamp", "0")
        expected = base64.b64encode(
            hmac.new(secret, f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()).decode()
        signatures = [s.split(",", 1)[1] for s in self.headers.get("webhook-signature", "").split() if s.startswith("v1,")]
        if not any(hmac.compare_digest(expected, s) for s in signatures):
            self.send_response(401)
            self.end_headers()
            print("refused a delivery with a bad signature", file=sys.stderr, flush=True)
            return
        if abs(time.time() - int(timestamp)) > 300:
            self.send_response(400)
            self.end_headers()
            print("refused a delivery with a stale timestamp", file=sys.stderr, flush=True)
            return
        self.send_response(204)
        self.end_headers()
        if webhook_id in seen:
            return  # a retry of something already handled
        seen.add(webhook_id)
        event = json.loads(body)
        if args.record:
            with open(args.record, "a") as record:
                headers = {name: self.headers.get(name) for name in ("webhook-id", "webhook-timestamp", "webhook-signature")}
                record.write(json.dumps({"secret": subscription["secret"], "headers": headers, "body": body.decode()}) + "\n")
        print(f"{event['timestamp']}  {event['type']:<26} {json.dumps(event['data'], sort_keys=True)}", flush=True)
        if event["type"] == args.exit_after:
            done = True

    def log_message(self, *_):
        pass


server = http.server.HTTPServer(("127.0.0.1", args.port), Receiver)
server.timeout = 0.5
if args.ready_file:
    open(args.ready_file, "w").write(subscription["id"] + "\n")
try:
    while not done:
        server.handle_request()
finally:
    broker("DELETE", f"/v1/webhook-subscriptions/{subscription['id']}")
