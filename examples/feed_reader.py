#!/usr/bin/env python3
"""Reads appleid-broker's pull feed of events, keeping its cursor (Python standard library only).

    python3 examples/feed_reader.py --broker http://127.0.0.1:8080 --key "$EVENTS_KEY" --cursor-file cursor.txt

The cursor is the only state: save it durably after a page has been handled, not before,
and the next run continues exactly there (at least once: handle events idempotently by id).
"""
import argparse
import json
import os
import sys
import urllib.parse
import urllib.request

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--broker", default="http://127.0.0.1:8080")
parser.add_argument("--key", required=True, help="an API key with the events scope")
parser.add_argument("--cursor-file", required=True)
args = parser.parse_args()

cursor = open(args.cursor_file).read().strip() if os.path.exists(args.cursor_file) else ""
count = 0
while True:
    query = {"limit": "100"} | ({"after": cursor} if cursor else {})
    request = urllib.request.Request(
        args.broker + "/v1/events?" + urllib.parse.urlencode(query), headers={"Authorization": "Bearer " + args.key})
    with urllib.request.urlopen(request, timeout=15) as response:
        page = json.load(response)
    for event in page["events"]:
        print(event["id"], event["type"], event.get("user_id") or "-", flush=True)
        count += 1
    if not page["events"] or page["next_cursor"] == cursor:
        break
    cursor = page["next_cursor"]
    with open(args.cursor_file + ".tmp", "w") as saved:
        saved.write(cursor)
    os.replace(args.cursor_file + ".tmp", args.cursor_file)
print(f"{count} new events", file=sys.stderr)
