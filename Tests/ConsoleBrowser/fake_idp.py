"""A small OpenID Connect provider for the console's browser tests (loopback only).

It plays the organisation's identity provider on http://localhost:PORT, a different site from
the console on 127.0.0.1, so cross-site cookie and form-action rules are the browser's real ones.
Discovery, JWKS, an authorize endpoint that signs in whichever operator the test chose (POST
/test/operator) without a form, a token endpoint (client_secret_basic or _post, PKCE S256)
issuing an RS256 ID token with the nonce, and auth_time as a real provider keeps it: the time
of the last password prompt, renewed by prompt=login or an exceeded max_age, unless the test
asks for a provider that ignores both. /test/frame and /test/post serve hostile pages from this
origin (framing the console; a cross-site auto-submitted form).
"""
import argparse, base64, hashlib, html, json, secrets, socket, threading, time, urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
KID = "fake-idp-1"
LOCK = threading.Lock()
# The operator the next /authorize signs in, and the quirks asked for (see /test/operator).
OPERATOR = {"sub": "op-1", "name": "Test Operator", "groups": []}
LAST_PROMPT = {}  # sub -> when the operator last typed a password here
CODES = {}  # code -> everything the token endpoint needs
LOG = []  # one entry per /authorize and /token, for the tests to read


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign(claims):
    header = {"alg": "RS256", "typ": "JWT", "kid": KID}
    signing_input = b64(json.dumps(header).encode()) + "." + b64(json.dumps(claims).encode())
    signature = KEY.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + b64(signature)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, status, body, content_type="application/json", headers=()):
        data = body if isinstance(body, bytes) else (json.dumps(body) if content_type == "application/json" else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        issuer = self.server.issuer
        if url.path == "/.well-known/openid-configuration":
            return self.send(200, {
                "issuer": issuer, "authorization_endpoint": issuer + "/authorize", "token_endpoint": issuer + "/token",
                "jwks_uri": issuer + "/jwks", "response_types_supported": ["code"], "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"], "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"]})
        if url.path == "/jwks":
            numbers = KEY.public_key().public_numbers()
            as_bytes = lambda n: n.to_bytes((n.bit_length() + 7) // 8, "big")
            return self.send(200, {"keys": [{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": KID,
                                             "n": b64(as_bytes(numbers.n)), "e": b64(as_bytes(numbers.e))}]})
        if url.path == "/authorize":
            return self.authorize(query)
        if url.path == "/test/log":
            with LOCK:
                return self.send(200, LOG)
        if url.path == "/test/frame":  # a page on this site that frames the console
            return self.send(200, f'<!doctype html><title>framing</title><iframe id="victim" src="{html.escape(query["url"])}" '
                                  'width="800" height="600"></iframe>', "text/html; charset=utf-8")
        if url.path == "/test/post":  # a cross-site form, submitted as soon as it loads
            fields = json.loads(query.get("fields", "{}"))
            inputs = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in fields.items())
            return self.send(200, f'<!doctype html><title>cross-site</title><form id="f" method="post" action="{html.escape(query["action"])}">'
                                  f'{inputs}</form><script>document.getElementById("f").submit()</script>', "text/html; charset=utf-8")
        self.send(404, {"error": "not_found"})

    def authorize(self, query):
        client = self.server.client_id
        if query.get("client_id") != client or query.get("response_type") != "code" or query.get("code_challenge_method") != "S256":
            return self.send(400, {"error": "invalid_request", "query": query})
        now = int(time.time())
        with LOCK:
            operator = dict(OPERATOR)
            sub = operator["sub"]
            last = LAST_PROMPT.setdefault(sub, now - operator.get("signed_in_ago", 3600))
            max_age = query.get("max_age")
            if not operator.get("ignore_reauth") and (query.get("prompt") == "login" or (max_age is not None and now - last > int(max_age))):
                last = LAST_PROMPT[sub] = now  # the operator typed the password again
            code = secrets.token_urlsafe(24)
            CODES[code] = {"query": query, "operator": operator, "auth_time": last, "issued": now}
            LOG.append({"endpoint": "authorize", "query": query, "auth_time": last})
        target = query["redirect_uri"] + ("&" if "?" in query["redirect_uri"] else "?")
        target += urllib.parse.urlencode({"code": code, "state": query.get("state", ""), **({"iss": self.server.issuer} if operator.get("send_iss") else {})})
        self.send(302, b"", "text/plain", [("Location", target)])

    def do_POST(self):
        url = urllib.parse.urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        if url.path == "/test/operator":  # the test's control: who signs in next, and how
            with LOCK:
                OPERATOR.clear()
                OPERATOR.update(json.loads(body))
                if OPERATOR.pop("forget", False):
                    LAST_PROMPT.pop(OPERATOR["sub"], None)
            return self.send(200, OPERATOR)
        if url.path != "/token":
            return self.send(404, {"error": "not_found"})
        form = dict(urllib.parse.parse_qsl(body))
        client_id, secret = form.get("client_id"), form.get("client_secret")
        if self.headers.get("Authorization", "").startswith("Basic "):
            client_id, _, secret = base64.b64decode(self.headers["Authorization"][6:]).decode().partition(":")
            client_id, secret = urllib.parse.unquote_plus(client_id), urllib.parse.unquote_plus(secret)
        if client_id != self.server.client_id or secret != self.server.client_secret:
            return self.send(401, {"error": "invalid_client"})
        with LOCK:
            grant = CODES.pop(form.get("code", ""), None)
            LOG.append({"endpoint": "token", "form": {k: v for k, v in form.items() if k != "client_secret"}})
        if grant is None or form.get("grant_type") != "authorization_code" or form.get("redirect_uri") != grant["query"]["redirect_uri"]:
            return self.send(400, {"error": "invalid_grant"})
        challenge = b64(hashlib.sha256(form.get("code_verifier", "").encode()).digest())
        if challenge != grant["query"].get("code_challenge"):
            return self.send(400, {"error": "invalid_grant", "error_description": "PKCE verifier does not match"})
        operator, now = grant["operator"], int(time.time())
        claims = {"iss": self.server.issuer, "sub": operator["sub"], "aud": self.server.client_id, "iat": now,
                  "exp": now + 300, "auth_time": grant["auth_time"], "name": operator.get("name", operator["sub"]),
                  self.server.groups_claim: operator.get("groups", [])}
        if "nonce" in grant["query"]:
            claims["nonce"] = grant["query"]["nonce"]
        claims.update(operator.get("claims", {}))  # a test's deliberate defect: wrong iss, aud, nonce, exp
        for name in operator.get("drop_claims", []):
            claims.pop(name, None)
        self.send(200, {"access_token": secrets.token_urlsafe(24), "token_type": "Bearer", "expires_in": 300, "id_token": sign(claims)})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--client-secret", required=True)
    parser.add_argument("--groups-claim", default="groups")
    parser.add_argument("--ready-file")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.issuer = f"http://localhost:{args.port}"
    server.client_id, server.client_secret, server.groups_claim = args.client_id, args.client_secret, args.groups_claim
    # "localhost" may resolve to ::1 first: answer there too when the host has IPv6 loopback.
    try:
        v6 = type("V6Server", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})(("::1", args.port), Handler)
        v6.issuer, v6.client_id, v6.client_secret, v6.groups_claim = server.issuer, args.client_id, args.client_secret, args.groups_claim
        threading.Thread(target=v6.serve_forever, daemon=True).start()
    except OSError:
        pass
    if args.ready_file:
        open(args.ready_file, "w").write(server.issuer + "\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
