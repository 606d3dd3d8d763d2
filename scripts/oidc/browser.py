"""A browser played with `requests`, for the relying-party tests: it follows redirects one at
a time and submits the auto-submitting form a page answers with (Apple's form post back to the
provider's Return URL), until a redirect reaches the relying party's redirect_uri, which it does
not fetch: the address is the result, as a real browser would have been sent there.

Against the broker the first redirect goes to Apple (here the simulator), whose page is the
self-posting form; against Glewlwyd the browser signs in through Glewlwyd's own login API
first, and the provider answers with the redirect at once."""

from html.parser import HTMLParser
from urllib.parse import parse_qs, urljoin, urlparse

import os

import requests


class FormParser(HTMLParser):
    """The first form of a page: its method, action and (hidden) inputs."""

    def __init__(self):
        super().__init__()
        self.action = None
        self.method = "get"
        self.fields = []
        self.in_form = False
        self.done = False

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        if tag == "form" and not self.done:
            self.in_form = True
            self.action = values.get("action")
            self.method = (values.get("method") or "get").lower()
        elif tag == "input" and self.in_form and values.get("name") is not None:
            self.fields.append((values["name"], values.get("value") or ""))

    def handle_endtag(self, tag):
        if tag == "form" and self.in_form:
            self.in_form = False
            self.done = True


class Browser:
    def __init__(self):
        self.session = requests.Session()
        self.pages = []  # (method, url, status) of every step, for failure messages

    def navigate(self, url, stop_at, max_steps=12):
        """Follows `url` until a redirect points under `stop_at`; returns that address.
        Returns the last response instead when the chain ends elsewhere (an error page)."""
        method, data = "GET", None
        for _ in range(max_steps):
            response = self.session.request(method, url, data=data, allow_redirects=False, timeout=15)
            # Browsers treat http://127.0.0.1 as a secure context and send it `Secure` cookies
            # (the tests run on loopback without TLS); Python's cookie jar would not.
            for cookie in self.session.cookies:
                cookie.secure = False
            self.pages.append((method, url, response.status_code))
            if response.is_redirect or response.status_code in (301, 302, 303, 307, 308):
                target = urljoin(url, response.headers["Location"])
                if target.startswith(stop_at):
                    return target
                login = urlparse(target)
                if login.path.endswith("/login.html") and "callback_url" in parse_qs(login.query):
                    # Glewlwyd's login page (a script app): signed in already, the person
                    # presses Continue, which sends the browser back with `g_continue`.
                    target = parse_qs(login.query)["callback_url"][0] + "&g_continue"
                method, data, url = "GET", None, target
                continue
            form = FormParser()
            form.feed(response.text if "html" in response.headers.get("Content-Type", "") else "")
            if response.status_code == 200 and form.action:
                target = urljoin(url, form.action)
                if form.method == "post":
                    method, data = "POST", form.fields
                else:
                    method, data = "GET", None
                    target += ("&" if "?" in target else "?") + "&".join(f"{k}={v}" for k, v in form.fields)
                url = target
                continue
            return response
        raise AssertionError(f"no end after {max_steps} steps: {self.pages}")

    def trail(self):
        return " -> ".join(f"{method} {url.split('?')[0]} {status}" for method, url, status in self.pages)


def browser_for(issuer, kind, username=None):
    """A fresh browser; for Glewlwyd signed in already through its login API as `username`
    (default GLEWLWYD_USER) with GLEWLWYD_PASSWORD (the broker signs people in at Apple on
    every authorization)."""
    person = Browser()
    if kind == "glewlwyd":
        answer = person.session.post(issuer.rsplit("/api/", 1)[0] + "/api/auth/", timeout=10, json={
            "username": username or os.environ["GLEWLWYD_USER"], "password": os.environ["GLEWLWYD_PASSWORD"]})
        assert answer.status_code == 200, f"glewlwyd login: {answer.status_code}"
    return person
