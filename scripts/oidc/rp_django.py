"""Two Django relying parties from PyPI, nobody's code here but the settings: each is a real
Django project written to a temporary folder, served by Django's own server on loopback, and
signed into through the broker and the Apple simulator by a browser played with `requests`.

- mozilla-django-oidc: sends the client secret in the body (its default, client_secret_post)
  while the client registered client_secret_basic; verifies the ID token's RS256 signature
  against the JWKS and its nonce, uses PKCE, reads userinfo and makes a Django user from the
  e-mail. Checked: the protected page shows that user; a callback with a state the RP did not
  issue is refused; with a JWKS that does not hold the broker's key, sign-in fails (the
  signature is really checked).
- django-allauth's OpenID Connect provider (openid_connect, discovery from server_url, PKCE,
  Basic at the token endpoint): verifies the ID token's iss, aud and exp (allauth skips the
  signature of a token it fetched itself over TLS, OpenID Connect Core §3.1.3.7) and keys the
  social account on sub; the Django username is preferred_username. Checked: the protected page
  shows that user and the social account's uid is the ID token's sub.

Called by scripts/oidc-rps.sh (the broker only). Environment: OIDC_ISSUER, API_KEY (an admin
key, to register the two clients over RFC 7591), SIM_URL (the simulator; its Apple keys are the
wrong JWKS), WORK (a folder for the projects)."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

import requests

from browser import Browser

ISSUER = os.environ["OIDC_ISSUER"].rstrip("/")
API_KEY = os.environ["API_KEY"]
SIM_URL = os.environ["SIM_URL"]
WORK = os.environ.get("WORK") or tempfile.mkdtemp()
META = requests.get(ISSUER + "/.well-known/openid-configuration", timeout=10).json()


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def register(metadata):
    answer = requests.post(META["registration_endpoint"], json=metadata,
                           headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
    assert answer.status_code == 201, f"registration: {answer.status_code} {answer.text}"
    return answer.json()


SETTINGS_COMMON = """
import os
BASE = os.path.dirname(os.path.abspath(__file__))
SECRET_KEY = "rp-test-only-" + "x" * 40
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
ROOT_URLCONF = "urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(BASE, "db.sqlite3")}}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
LOGIN_REDIRECT_URL = "/whoami/"
LOGGING = {"version": 1, "handlers": {"f": {"class": "logging.FileHandler", "filename": os.path.join(BASE, "rp.log")}},
           "root": {"handlers": ["f"], "level": "INFO"}}
"""

WHOAMI = """
from django.contrib.auth.decorators import login_required
from django.http import JsonResponse

@login_required
def whoami(request):
    user = request.user
    answer = {"username": user.username, "email": user.email}
    try:
        from allauth.socialaccount.models import SocialAccount
        account = SocialAccount.objects.get(user=user)
        answer["uid"] = account.uid
        answer["extra"] = account.extra_data
    except Exception:
        pass
    return JsonResponse(answer)
"""


class DjangoRP:
    """One Django project on a free loopback port."""

    def __init__(self, name, settings, urls):
        self.dir = os.path.join(WORK, name)
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        with open(os.path.join(self.dir, "settings.py"), "w") as f:
            f.write(SETTINGS_COMMON + textwrap.dedent(settings))
        with open(os.path.join(self.dir, "urls.py"), "w") as f:
            f.write(textwrap.dedent(urls))
        with open(os.path.join(self.dir, "rpviews.py"), "w") as f:
            f.write(WHOAMI)
        self.env = dict(os.environ, DJANGO_SETTINGS_MODULE="settings", PYTHONPATH=self.dir)
        self.process = None

    def manage(self, *arguments):
        return subprocess.run([sys.executable, "-m", "django", *arguments], env=self.env, cwd=self.dir,
                              capture_output=True, text=True, timeout=120)

    def start(self):
        migrated = self.manage("migrate", "--noinput")
        assert migrated.returncode == 0, migrated.stderr
        log = open(os.path.join(self.dir, "server.log"), "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{self.port}", "--noreload"],
            env=self.env, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                requests.get(self.base + "/whoami/", timeout=2, allow_redirects=False)
                return self
            except requests.ConnectionError:
                assert self.process.poll() is None, self.logs()
                time.sleep(0.1)
        raise AssertionError(f"{self.dir}: the Django server did not start: {self.logs()}")

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def logs(self):
        text = ""
        for name in ("server.log", "rp.log"):
            path = os.path.join(self.dir, name)
            if os.path.exists(path):
                text += f"--- {name}\n" + open(path).read()[-3000:]
        return text

    def sign_in(self, login_path, callback_path):
        """The browser's trip: the RP's login URL → the broker → Apple (the simulator) → the RP's
        callback, then the page behind login. Returns (browser, whoami JSON)."""
        person = Browser()
        back = person.navigate(self.base + login_path, stop_at=self.base + callback_path)
        assert isinstance(back, str), f"no redirect back to the RP: {person.trail()}"
        query = parse_qs(urlparse(back).query)
        assert "code" in query and query.get("iss") == [ISSUER], f"{back}"
        landed = person.session.get(back, timeout=20, allow_redirects=True)
        assert landed.status_code == 200, f"{landed.status_code} at {landed.url}: {landed.text[:300]}\n{self.logs()}"
        assert urlparse(landed.url).path == "/whoami/", f"ended at {landed.url}\n{self.logs()}"
        return person, landed.json(), back


def tampered_state(callback):
    """The callback URL with a state the RP never issued."""
    parts = urlparse(callback)
    query = parse_qs(parts.query)
    query["state"] = ["not-the-rps-state"]
    return urlunparse(parts._replace(query=urlencode({k: v[0] for k, v in query.items()})))


def mozilla(results):
    callback = "/oidc/callback/"
    port = free_port()
    client = register({"client_name": "mozilla-django-oidc", "redirect_uris": [f"http://127.0.0.1:{port}{callback}"],
                       "token_endpoint_auth_method": "client_secret_basic", "scope": "openid email profile"})

    def project(name, jwks):
        rp = DjangoRP(name, f"""
            INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions",
                              "mozilla_django_oidc"]
            MIDDLEWARE = ["django.contrib.sessions.middleware.SessionMiddleware",
                          "django.contrib.auth.middleware.AuthenticationMiddleware"]
            AUTHENTICATION_BACKENDS = ["mozilla_django_oidc.auth.OIDCAuthenticationBackend"]
            LOGIN_URL = "/oidc/authenticate/"
            OIDC_RP_CLIENT_ID = {client["client_id"]!r}
            OIDC_RP_CLIENT_SECRET = {client["client_secret"]!r}
            OIDC_RP_SIGN_ALGO = "RS256"
            OIDC_RP_SCOPES = "openid email profile"
            OIDC_USE_PKCE = True
            OIDC_OP_AUTHORIZATION_ENDPOINT = {META["authorization_endpoint"]!r}
            OIDC_OP_TOKEN_ENDPOINT = {META["token_endpoint"]!r}
            OIDC_OP_USER_ENDPOINT = {META["userinfo_endpoint"]!r}
            OIDC_OP_JWKS_ENDPOINT = {jwks!r}
            LOGIN_REDIRECT_URL_FAILURE = "/failed/"
            """, """
            from django.http import HttpResponse
            from django.urls import include, path
            from rpviews import whoami
            urlpatterns = [path("oidc/", include("mozilla_django_oidc.urls")), path("whoami/", whoami),
                           path("failed/", lambda request: HttpResponse("sign-in failed", status=403))]
            """)
        rp.port = port
        rp.base = f"http://127.0.0.1:{port}"
        return rp

    rp = project("mozilla", META["jwks_uri"]).start()
    try:
        person, me, back = rp.sign_in("/oidc/authenticate/", callback)
        assert me["email"].endswith("@privaterelay.appleid.com") or "@" in me["email"], me
        results.append(f"mozilla-django-oidc: signed in as Django user with e-mail {me['email']} "
                       "(secret sent in the body, ID token signature and nonce verified, userinfo read)")
        # A second visit needs no sign-in: the Django session holds.
        again = person.session.get(rp.base + "/whoami/", timeout=10, allow_redirects=False)
        assert again.status_code == 200 and again.json()["email"] == me["email"], again.status_code
        # A callback with a state this RP did not issue is refused (no session for a stranger).
        stranger = Browser()
        forged = stranger.session.get(tampered_state(back), timeout=10, allow_redirects=True)
        assert urlparse(forged.url).path != "/whoami/", f"a forged state signed someone in: {forged.url}"
        results.append("mozilla-django-oidc: a callback with a state it did not issue is refused")
    finally:
        rp.stop()

    # The same RP with the simulator's Apple keys as its JWKS: the broker's signature cannot
    # verify, so the sign-in must fail at the RP.
    wrong = project("mozilla-wrong-jwks", SIM_URL + "/auth/keys").start()
    try:
        person = Browser()
        back = person.navigate(wrong.base + "/oidc/authenticate/", stop_at=wrong.base + callback)
        assert isinstance(back, str), person.trail()
        landed = person.session.get(back, timeout=20, allow_redirects=True)
        # mozilla-django-oidc raises on a key it cannot find (a 500 at the callback) or
        # redirects to the failure URL on a bad signature; either way no session.
        assert urlparse(landed.url).path != "/whoami/", f"signed in with an unverifiable ID token: {landed.url}"
        after = person.session.get(wrong.base + "/whoami/", timeout=10, allow_redirects=False)
        assert after.status_code == 302, f"a session exists after an unverifiable ID token: {after.status_code}"
        results.append("mozilla-django-oidc: with a JWKS that lacks the broker's key, sign-in fails (signature checked)")
    finally:
        wrong.stop()


def allauth(results):
    callback = "/accounts/oidc/broker/login/callback/"
    port = free_port()
    client = register({"client_name": "django-allauth", "redirect_uris": [f"http://127.0.0.1:{port}{callback}"],
                       "token_endpoint_auth_method": "client_secret_basic", "scope": "openid email profile"})
    rp = DjangoRP("allauth", f"""
        INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions",
                          "django.contrib.messages", "django.contrib.sites", "allauth", "allauth.account",
                          "allauth.socialaccount", "allauth.socialaccount.providers.openid_connect"]
        SITE_ID = 1
        MIDDLEWARE = ["django.contrib.sessions.middleware.SessionMiddleware",
                      "django.contrib.auth.middleware.AuthenticationMiddleware",
                      "django.contrib.messages.middleware.MessageMiddleware",
                      "allauth.account.middleware.AccountMiddleware"]
        TEMPLATES = [{{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
                       "OPTIONS": {{"context_processors": ["django.template.context_processors.request",
                                                           "django.contrib.auth.context_processors.auth",
                                                           "django.contrib.messages.context_processors.messages"]}}}}]
        AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend",
                                   "allauth.account.auth_backends.AuthenticationBackend"]
        LOGIN_URL = "/accounts/oidc/broker/login/"
        SOCIALACCOUNT_LOGIN_ON_GET = True
        SOCIALACCOUNT_AUTO_SIGNUP = True
        SOCIALACCOUNT_EMAIL_AUTHENTICATION = False
        ACCOUNT_EMAIL_VERIFICATION = "none"
        SOCIALACCOUNT_STORE_TOKENS = False
        SOCIALACCOUNT_PROVIDERS = {{"openid_connect": {{"OAUTH_PKCE_ENABLED": True, "APPS": [{{
            "provider_id": "broker", "name": "Sign in with Apple (broker)",
            "client_id": {client["client_id"]!r}, "secret": {client["client_secret"]!r},
            "settings": {{"server_url": {ISSUER!r}, "token_auth_method": "client_secret_basic"}}}}]}}}}
        """, """
        from django.urls import include, path
        from rpviews import whoami
        urlpatterns = [path("accounts/", include("allauth.urls")), path("whoami/", whoami)]
        """)
    rp.port = port
    rp.base = f"http://127.0.0.1:{port}"
    rp.start()
    try:
        person, me, back = rp.sign_in("/accounts/oidc/broker/login/", callback)
        id_token = me["extra"]["id_token"]
        assert id_token["iss"] == ISSUER and id_token["aud"] == client["client_id"], id_token
        assert me["uid"] == id_token["sub"], f"the social account is keyed on sub: {me['uid']} vs {id_token['sub']}"
        assert me["username"] and me["username"] == me["extra"]["userinfo"].get("preferred_username"), me
        results.append(f"django-allauth: signed in; social account uid = sub {me['uid']}, "
                       f"username = preferred_username {me['username']} (iss, aud, exp verified)")
        stranger = Browser()
        forged = stranger.session.get(tampered_state(back), timeout=10, allow_redirects=True)
        assert urlparse(forged.url).path != "/whoami/", f"a forged state signed someone in: {forged.url}"
        results.append("django-allauth: a callback with a state it did not issue is refused")
    finally:
        rp.stop()


def main():
    results, failures = [], []
    for name, run in (("mozilla-django-oidc", mozilla), ("django-allauth", allauth)):
        try:
            run(results)
        except Exception:
            failures.append(name)
            print(f"django RP {name}: FAILED\n{traceback.format_exc()}", file=sys.stderr)
    for line in results:
        print("  ok:", line, file=sys.stderr)
    print(f"django relying parties: {2 - len(failures)} passed, {len(failures)} failed", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
