#!/usr/bin/env python3
"""An app backend's login call to appleid-broker (Python standard library only).

    python3 examples/login.py --broker http://127.0.0.1:8080 --key "$LOGIN_KEY" \
        --identity-token "$TOKEN" --authorization-code "$CODE" --raw-nonce "$RAW_NONCE"

The nonce: the app makes a random raw nonce on the device for every sign-in, puts its
lowercase hex SHA-256 into the Apple request (ASAuthorizationAppleIDRequest.nonce), and
sends the raw one to its backend, which passes it on as raw_nonce (`hash_nonce` below is
what the app computes). Errors are RFC 9457 problems: switch on `code`, never on the text.
"""
import argparse
import base64
import hashlib
import json
import os
import sys
import urllib.error
import urllib.request


def new_raw_nonce() -> str:
    return base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()


def hash_nonce(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class Problem(Exception):
    def __init__(self, status, body):
        super().__init__(f"{body.get('code', status)}: {body.get('detail', '')}")
        self.status, self.code = status, body.get("code")


def login(broker, key, identity_token, raw_nonce=None, authorization_code=None, user=None):
    body = {"identity_token": identity_token}
    for name, value in (("raw_nonce", raw_nonce), ("authorization_code", authorization_code), ("user", user)):
        if value:
            body[name] = value
    request = urllib.request.Request(
        broker + "/v1/apple/login", method="POST", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        raise Problem(error.code, json.load(error)) from None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="http://127.0.0.1:8080")
    parser.add_argument("--key", required=True, help="an API key with the login scope")
    parser.add_argument("--identity-token", required=True)
    parser.add_argument("--authorization-code")
    parser.add_argument("--raw-nonce")
    args = parser.parse_args()
    try:
        answer = login(args.broker, args.key, args.identity_token, args.raw_nonce, args.authorization_code)
    except Problem as problem:
        print(problem, file=sys.stderr)
        sys.exit(1)
    # Start your own session for answer["user_id"]; "email" is verified, "unverified_email" never is.
    print(json.dumps(answer))
