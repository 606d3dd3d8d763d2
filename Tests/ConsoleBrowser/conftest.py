"""Fixtures of the console's browser tests (scripts/console-browser.sh starts the stack and sets
CONSOLE_URL, IDP_URL, BROKER_URL, SIM_URL, API_KEY, BROKER_BIN, AXE_JS)."""
import http.client, json, os, re, subprocess, tempfile, shutil, time, urllib.parse
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.support.ui import WebDriverWait

CONSOLE = os.environ.get("CONSOLE_URL", "")
IDP = os.environ.get("IDP_URL", "")
BROKER = os.environ.get("BROKER_URL", "")
SIM = os.environ.get("SIM_URL", "")
API_KEY = os.environ.get("API_KEY", "")
COOKIE = "__Host-console"  # the session cookie (docs/console.md)
# axe-core's rules for WCAG 2.0, 2.1 and 2.2, levels A and AA (issue 30).
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa"]
ROLE_GROUPS = {"viewer": "viewers", "operator": "ops", "compliance": "dpo", "admin": "admins"}


# ---- plain HTTP (no redirects followed), for status codes, headers and the role matrix ----

class Response:
    def __init__(self, raw):
        self.status, self.headers, self.body = raw.status, raw.headers, raw.read().decode("utf-8", "replace")

    def header(self, name):
        return self.headers.get(name)

    def cookies(self):
        return self.headers.get_all("Set-Cookie") or []

    def csrf(self):
        match = re.search(r'name="csrf_token"\s+value="([^"]+)"', self.body) or re.search(r'value="([^"]+)"\s+name="csrf_token"', self.body)
        return match.group(1) if match else None


def request(method, url, body=None, headers=None):
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    path = parts.path + ("?" + parts.query if parts.query else "")
    all_headers = dict(headers or {})
    if isinstance(body, dict):
        body = urllib.parse.urlencode(body)
        all_headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
    connection.request(method, path or "/", body=body, headers=all_headers)
    response = Response(connection.getresponse())
    connection.close()
    return response


class ConsoleClient:
    """One operator's session over plain HTTP: keeps the session cookie, sends the page's CSRF token."""

    def __init__(self, cookie=None):
        self.cookie = cookie

    def _headers(self, extra=None):
        headers = {"Cookie": f"{COOKIE}={self.cookie}"} if self.cookie else {}
        headers.update(extra or {})
        return headers

    def get(self, path, headers=None):
        return request("GET", CONSOLE + path, headers=self._headers(headers))

    def post(self, path, fields=None, headers=None):
        return request("POST", CONSOLE + path, body=dict(fields or {}), headers=self._headers({"Origin": CONSOLE, **(headers or {})}))

    def csrf_for(self, path="/"):
        token = self.get(path).csrf()
        assert token, f"no csrf_token field on {path}"
        return token


def console_link(operator, role, ttl="15m"):
    """A single-use sign-in URL from `appleid-broker console link` (the break-glass path)."""
    out = subprocess.run([os.path.join(os.environ["BROKER_BIN"], "appleid-broker"), "console", "link", "--operator", operator,
                          "--role", role, "--ttl", ttl], check=True, capture_output=True, text=True, timeout=60).stdout
    match = re.search(r"https?://\S+", out)
    assert match, f"console link printed no URL: {out!r}"
    return match.group(0)


def session_cookie(response):
    for header in response.cookies():
        name, _, rest = header.partition("=")
        if name == COOKIE:
            value = rest.split(";", 1)[0]
            if value:
                return value
    return None


def link_session(role, operator=None):
    """Signs in over plain HTTP through a console link; returns a ConsoleClient for that role."""
    url = console_link(operator or f"{role}-by-link", role)
    path = url[len(urllib.parse.urlsplit(url)._replace(path="", query="", fragment="").geturl()):]
    form = request("GET", CONSOLE + path)
    assert form.status == 200, (form.status, form.body[:300])
    fields = dict(re.findall(r'<input[^>]*name="([^"]+)"[^>]*value="([^"]*)"', form.body))
    for _ in range(30):
        answer = request("POST", CONSOLE + urllib.parse.urlsplit(url).path, body=fields, headers={"Origin": CONSOLE})
        if answer.status != 429:
            break
        # Redemptions are rate-limited per address (bursts of 10), and every test comes from 127.0.0.1.
        time.sleep(float(answer.header("Retry-After") or 6) + 0.2)
    cookie = session_cookie(answer)
    assert cookie, (answer.status, answer.cookies(), answer.body[:300])
    return ConsoleClient(cookie)


# ---- the fake identity provider ----

def idp_operator(sub, groups, **quirks):
    """Who the fake provider signs in next: sub, groups and quirks (fake_idp.py, /test/operator)."""
    body = json.dumps({"sub": sub, "name": sub.title(), "groups": groups, **quirks})
    response = request("POST", IDP + "/test/operator", body=body, headers={"Content-Type": "application/json"})
    assert response.status == 200


def idp_log():
    return json.loads(request("GET", IDP + "/test/log").body)


# ---- the broker's JSON API and the simulator, for fixtures and evidence ----

def api(method, path, body=None):
    response = request(method, BROKER + path, body=json.dumps(body) if body is not None else None,
                       headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    return response.status, (json.loads(response.body) if response.body.strip() else None)


def api_deletion(user_id, reason):
    """A deletion requested through the compliance API (as a backend would); returns its id."""
    status, answer = api("POST", "/v1/deletions", {"user_id": user_id, "reason": reason, "requested_by": "console-tests"})
    assert status in (200, 201, 202), answer
    return answer["deletion_id"]


def deletion(deletion_id):
    status, answer = api("GET", f"/v1/deletions/{deletion_id}")
    assert status == 200, answer
    return answer


def notify(kind, sub, client_id="com.example.app"):
    """A signed server-to-server notification, as Apple sends it (the simulator signs and posts it)."""
    return sim("POST", "/sim/notifications", {"url": BROKER + "/v1/apple/notifications", "type": kind, "sub": sub,
                                              "client_id": client_id})


def faults(**settings):
    """The simulator's fault switches (FaultSettings: latency_ms, error_rate, endpoints, …); none: healthy."""
    return sim("PUT", "/sim/faults", settings)


def sim(method, path, body=None):
    response = request(method, SIM + path, body=json.dumps(body) if body is not None else None,
                       headers={"Content-Type": "application/json"})
    return json.loads(response.body) if response.body.strip() else None


def new_user(client_ids=("com.example.app",), email=None, with_code=True):
    """A user signed in through the broker's login API, once per app (a stored refresh token each
    when with_code). Returns (user_id, sub)."""
    sub, user_id = None, None
    for client_id in client_ids:
        body = {"client_id": client_id, "with_code": with_code}
        if sub:
            body["sub"] = sub
        if email:
            body["email"] = email
        minted = sim("POST", "/sim/tokens", body)
        login = {"identity_token": minted["id_token"]}
        if with_code:
            login["authorization_code"] = minted["code"]
        status, answer = api("POST", "/v1/apple/login", login)
        assert status == 200, answer
        sub, user_id = sub or minted.get("sub") or answer.get("sub"), answer["user_id"]
    return user_id, sub


# ---- the browser ----

def make_driver(javascript=True):
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="console-chromium-")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", f"--user-data-dir={profile}",
                     "--window-size=1280,800", "--force-device-scale-factor=1", "--lang=en-US", "--no-first-run",
                     "--disable-extensions", "--disable-background-networking", "--font-render-hinting=none"):
        options.add_argument(argument)
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)
    driver.set_page_load_timeout(30)
    # Selenium's window size is the outer window: make the viewport itself 1280×800.
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    driver.set_window_size(1280 + (1280 - inner[0]), 800 + (800 - inner[1]))
    driver._profile = profile
    return driver


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.failed_call = report.failed


@pytest.fixture(scope="session")
def shared_driver():
    """One Chromium for every test that uses `browser`: starting one costs about 2.5 CPU-seconds,
    as much as a short test. Each test gets it back in the state of a new profile (`reset`)."""
    driver = make_driver()
    yield driver
    driver.quit()
    shutil.rmtree(driver._profile, ignore_errors=True)


def reset(driver):
    """What a fresh profile would hold: one window on a blank page, no cookies, storage or cache on
    any site, no alert, an empty browser log."""
    handles = driver.window_handles
    for handle in handles[1:]:
        driver.switch_to.window(handle)
        driver.close()
    driver.switch_to.window(handles[0])
    try:
        driver.switch_to.alert.dismiss()
    except Exception:
        pass
    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.execute_cdp_cmd("Network.clearBrowserCache", {})
    for origin in {CONSOLE, IDP, BROKER, SIM} - {""}:
        driver.execute_cdp_cmd("Storage.clearDataForOrigin", {"origin": origin.rstrip("/"), "storageTypes": "all"})
    driver.get_log("browser")


@pytest.fixture
def browser(request, shared_driver):
    driver = shared_driver
    reset(driver)
    yield driver
    # A failed test leaves the page it ended on (HTML and PNG) in $WORK/failures for a look.
    if getattr(request.node, "failed_call", False) and os.environ.get("WORK"):
        directory = os.path.join(os.environ["WORK"], "failures")
        os.makedirs(directory, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)
        try:
            open(os.path.join(directory, name + ".html"), "w").write(driver.current_url + "\n" + driver.page_source)
            driver.save_screenshot(os.path.join(directory, name + ".png"))
        except Exception:
            pass


def sign_in(driver, role, sub=None, **quirks):
    """Signs in through the fake identity provider in Chromium, as a person would: the sign-in
    page's link, the provider, the callback's interstitial, the overview."""
    idp_operator(sub or f"{role}-1", [ROLE_GROUPS[role]], **quirks)
    driver.get(CONSOLE + "/login")
    driver.find_element("css selector", 'a[href^="/login/oidc"]').click()
    WebDriverWait(driver, 15).until(lambda d: d.current_url.rstrip("/") == CONSOLE and "Overview" in d.title)
    return driver


def navigation_status(driver):
    return driver.execute_script("return performance.getEntriesByType('navigation')[0].responseStatus")


def sign_in_by_link(driver, role, operator=None):
    """Signs in in Chromium through a `console link` URL: its page, then its Sign in button.
    Waits out the per-address redemption limit (429) as a person would."""
    url = console_link(operator or f"{role}-by-link", role)
    for _ in range(30):
        driver.get(url)
        driver.find_element("css selector", "main form button[type=submit]").click()
        WebDriverWait(driver, 15).until(lambda d: "/link" not in d.current_url or navigation_status(d) != 200)
        if navigation_status(driver) != 429:
            break
        time.sleep(6.2)
    WebDriverWait(driver, 15).until(lambda d: browser_cookie(d) and "Overview" in d.title)
    return driver


def page_left(driver, element, timeout=15):
    """Waits until the page `element` was on is gone (a click on it navigated). Selenium's
    staleness_of is not enough: while the new document replaces the old one, chromedriver may
    answer the element's lookup with an inspector error ("Node with given id does not belong to
    the document", seen failing CI once) instead of a stale-element error. Both say the same."""
    def gone(_):
        try:
            element.is_enabled()
            return False
        except StaleElementReferenceException:
            return True
        except WebDriverException as error:
            if "does not belong to the document" in str(error):
                return True
            raise
    WebDriverWait(driver, timeout).until(gone)


def browser_cookie(driver):
    return next((c for c in driver.get_cookies() if c["name"] == COOKIE), None)


def console_messages(driver):
    """The browser log's entries since the last call (Chromium reports CSP violations there)."""
    return [entry["message"] for entry in driver.get_log("browser")]


def csp_violations(messages):
    return [m for m in messages if "Content Security Policy" in m or "Refused to" in m]


def axe_violations(driver):
    with open(os.environ["AXE_JS"]) as source:
        driver.execute_script(source.read())
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {runOnly: {type: 'tag', values: arguments[0]}, resultTypes: ['violations']})"
        ".then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " nodes: v.nodes.map(n => n.html)})))).catch(e => done([{id: 'axe-error', help: String(e), nodes: []}]));",
        AXE_TAGS)
    return result


def wait_for(predicate, timeout=20, interval=0.2, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
