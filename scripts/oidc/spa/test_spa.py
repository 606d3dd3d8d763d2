"""A single-page application signs in through the broker in headless Chromium (issue 36): a
public client with PKCE S256, the code exchanged and userinfo read by fetch() across origins
(the SPA on http://localhost, the provider on http://127.0.0.1: another site, so CORS and
SameSite are the browser's real rules), then silent renewal with prompt=none (a top-level
navigation that comes straight back: in an iframe of another site the provider's cookie would be
a third-party cookie, which Chromium withholds), answered from the session without Apple.
scripts/oidc-spa-browser.sh starts the stack and sets ISSUER, API_KEY, SIM_URL."""
import json, os, shutil, tempfile, threading, urllib.request
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import (
    NoSuchElementException, StaleElementReferenceException, TimeoutException, WebDriverException)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ISSUER = os.environ.get("ISSUER", "")
SIM_URL = os.environ.get("SIM_URL", "")
HERE = os.path.dirname(os.path.abspath(__file__))


def post_json(url, body, key):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def apple_authorizations():
    with urllib.request.urlopen(SIM_URL + "/sim/stats", timeout=10) as response:
        return json.load(response)["authorize"]


@pytest.fixture(scope="module")
def spa():
    """The SPA's static files on http://localhost:PORT, registered as a public client."""
    config = {}

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == "/config.json":
                data = json.dumps(config).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            super().do_GET()

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=HERE))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://localhost:{server.server_address[1]}"
    client = post_json(ISSUER + "/register", {
        "client_name": "single-page app", "token_endpoint_auth_method": "none",
        "redirect_uris": [origin + "/callback.html"], "scope": "openid email"}, os.environ["API_KEY"])
    config.update({"issuer": ISSUER, "client_id": client["client_id"]})
    yield origin
    server.shutdown()


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="spa-chromium-")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", f"--user-data-dir={profile}",
                     "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def text(driver, element):
    return driver.find_element(By.ID, element).text


def wait_for(driver, element, predicate, what):
    """Waits, across the page loads of a redirect, until `element` satisfies `predicate` or the
    page shows an error."""
    def settled(d):
        try:
            return predicate(text(d, element)) or bool(text(d, "error"))
        except (NoSuchElementException, StaleElementReferenceException):
            return False
        except WebDriverException as error:
            # The element went with the page a redirect replaced, reported by this Chromium as an
            # inspector error rather than as a stale element.
            if "does not belong to the document" in str(error):
                return False
            raise
    try:
        WebDriverWait(driver, 30).until(settled)
    except TimeoutException:
        pass
    console = [entry["message"] for entry in driver.get_log("browser")][-5:]
    error = text(driver, "error")
    assert not error, f"{what}: the page says {error!r} at {driver.current_url}; console: {console}"
    assert predicate(text(driver, element)), f"{what}: {element} is {text(driver, element)!r}; console: {console}"


def test_silent_renewal_without_a_session_is_login_required(spa, browser):
    browser.get(spa + "/")
    before = apple_authorizations()
    browser.find_element(By.ID, "renew").click()
    wait_for(browser, "renew-status", lambda t: t == "login_required", "prompt=none in a new browser")
    assert apple_authorizations() == before, "prompt=none never shows Apple's page"


def test_sign_in_with_pkce_and_cors_then_silent_renewal_without_apple(spa, browser):
    browser.get(spa + "/")
    before = apple_authorizations()
    browser.find_element(By.ID, "sign-in").click()
    # To the provider, Apple's page (the simulator's self-posting form), the callback, the SPA.
    wait_for(browser, "status", lambda t: t == "signed in", "sign-in")
    assert apple_authorizations() == before + 1, "one trip to Apple"
    sub = text(browser, "sub")
    assert sub and text(browser, "userinfo-sub") == sub, "userinfo read by fetch() across origins, with the ID token's subject"
    # The provider's session cookie, as the browser keeps it for the provider's site.
    browser.get(ISSUER + "/.well-known/openid-configuration")
    cookies = {c["name"]: c for c in browser.get_cookies()}
    session = cookies.get("__Host-abk_oidc")
    assert session and session["secure"] and session["httpOnly"] and session["sameSite"] == "None" and session["path"] == "/", \
        f"the session cookie at the provider: {cookies}"
    browser.get(spa + "/")
    # Silent renewal: prompt=none, answered at once from the provider's session.
    browser.find_element(By.ID, "renew").click()
    wait_for(browser, "renew-status", lambda t: t == "renewed", "silent renewal")
    assert text(browser, "renew-sub") == sub
    assert text(browser, "renew-userinfo-sub") == sub
    assert text(browser, "renew-auth-time") == text(browser, "auth-time"), "auth_time is the sign-in at Apple's"
    assert text(browser, "renew-sid") == text(browser, "sid"), "the same session"
    assert apple_authorizations() == before + 1, "renewal did not go to Apple"
