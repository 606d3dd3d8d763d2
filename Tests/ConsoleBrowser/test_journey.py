"""The deletion journey in Chromium: compliance confirms a deletion by keyboard alone while the
Apple simulator delays and fails every revoke; the pages show each state truthfully (never
"deleted" before the purge); an operator retries once Apple is back; the evidence report names
each client id's outcome. And a follow-up that a later consent-revoked notification closes."""
import datetime, json, re, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys
from conftest import (api, sign_in_by_link, navigation_status, CONSOLE, browser_cookie, deletion, faults, new_user, notify, sim, wait_for,
                      api_deletion, link_session, request)

APPS = ("com.example.app", "com.example.other")




def press(browser, *keys):
    ActionChains(browser).send_keys(*keys).perform()


def focused(browser):
    element = browser.switch_to.active_element
    return element.get_attribute("id") or element.get_attribute("name") or element.tag_name + ":" + element.text


def tab_to(browser, wanted, limit=40):
    """Tab (only the keyboard) until the element with this id has focus; returns the ids passed."""
    passed = []
    for _ in range(limit):
        press(browser, Keys.TAB)
        current = focused(browser)
        passed.append(current)
        if current == wanted:
            return passed
    raise AssertionError(f"Tab never reached {wanted}; focus went {passed}")


def shown_state(browser):
    return browser.find_element("css selector", "dl dd[class^=state-]").text


class Receiver(BaseHTTPRequestHandler):
    """A backend that takes every webhook delivery (the evidence lists who was told, Art. 19)."""
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass



def timeline_text(browser):
    """The deletion page's timeline table (the per-app-group table stands before it since issue 35)."""
    tables = browser.find_elements("css selector", "main table")
    return next(t.text for t in tables if t.find_element("css selector", "caption").text.startswith("Timeline"))

def test_deletion_journey_with_apple_failing_then_retry(browser):
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    status, subscription = api("POST", "/v1/webhook-subscriptions",
                               {"url": f"http://127.0.0.1:{receiver.server_address[1]}/hooks", "topics": ["user.deleted"]})
    assert status in (200, 201), subscription
    user_id, sub = new_user(client_ids=APPS)
    # Apple slow and failing every revoke: the deletion cannot get past revoking.
    faults(latency_ms=300, error_rate=1.0, error_statuses=[500], endpoints=["revoke"])
    try:
        sign_in_by_link(browser, "compliance", "dpo-journey")
        # Keyboard only, from the top of the new-deletion page: choose "user id", type it, Enter.
        browser.get(CONSOLE + "/deletions/new")
        tab_to(browser, "identify_by")
        tab_to(browser, "value")
        press(browser, user_id, Keys.ENTER)
        wait_for(lambda: "Confirm" in browser.title, what="the confirmation page")
        body = browser.find_element("tag name", "main").text
        assert user_id in body and sub not in body, "the confirmation page shows the user and masks the sub"
        for app in APPS:
            assert app in body
        code = browser.find_element("css selector", ".code").text.strip()
        order = []
        order += tab_to(browser, "reason"); press(browser, "Erasure request under Art. 17")
        order += tab_to(browser, "ticket"); press(browser, "DSAR-1042")
        order += tab_to(browser, "received_date")
        today = datetime.date.today()
        press(browser, f"{today.month:02d}{today.day:02d}{today.year}")
        order += tab_to(browser, "confirmation_code"); press(browser, code)
        # A date input takes one Tab per part (month, day, year): count each field once.
        fields = [name for index, name in enumerate(order) if name in ("reason", "ticket", "received_date", "confirmation_code")
                  and (index == 0 or order[index - 1] != name)]
        assert fields == ["reason", "ticket", "received_date", "confirmation_code"], f"tab order {order}"
        press(browser, Keys.TAB)
        assert browser.switch_to.active_element.text == "Delete this user", focused(browser)
        press(browser, Keys.ENTER)
        wait_for(lambda: re.search(r"/deletions/[0-9a-f-]{36}$", browser.current_url), what="the deletion's page")
        deletion_id = browser.current_url.rsplit("/", 1)[1]

        # While Apple fails: the page never says deleted, and says what the broker's record says.
        seen = set()
        def settled():
            browser.refresh()
            state, words = deletion(deletion_id)["state"], shown_state(browser)
            assert not words.lower().startswith("deleted"), f"shown '{words}' while the deletion is {state}"
            assert "nothing deleted yet" in words, words
            seen.add(words.split(":")[0].split(" (")[0])
            return state == "failed" and words.startswith("Failed")
        wait_for(settled, timeout=90, interval=0.5, what="the deletion to fail")
        assert deletion(deletion_id)["completed_at"] is None
        # The timeline says why: Apple's refusals, per client id (the job stops at the first).
        timeline = timeline_text(browser)
        assert any(app in line and "will retry" in line for line in timeline.splitlines() for app in APPS), timeline
    finally:
        faults()

    # Apple is back: an operator retries (confirmation page, then the POST).
    sign_in_by_link(browser, "operator", "ops-journey")
    browser.get(f"{CONSOLE}/deletions/{deletion_id}")
    browser.find_element("link text", "Retry this deletion").click()
    browser.find_element("css selector", "main form button[type=submit]").click()
    wait_for(lambda: browser.current_url.endswith(f"/deletions/{deletion_id}"), what="back on the deletion")
    def done():
        browser.refresh()
        state, words = deletion(deletion_id)["state"], shown_state(browser)
        if state != "done":
            assert not words.lower().startswith("deleted"), f"shown '{words}' while the deletion is {state}"
        return state == "done" and words.startswith("Deleted")
    wait_for(done, timeout=60, interval=0.5, what="the retried deletion to be done")
    timeline = timeline_text(browser)
    for app in APPS:
        assert any(app in line and line.rstrip().endswith("revoked") for line in timeline.splitlines()), f"{app}:\n{timeline}"
    revoked = {entry["client_id"] for entry in sim("GET", "/sim/revocations") if entry.get("sub") == sub and entry["outcome"] == "revoked"}
    assert set(APPS) <= revoked, revoked

    # The evidence: each client id's outcome, on the printable page and in the JSON.
    sign_in_by_link(browser, "compliance", "dpo-journey")
    browser.get(f"{CONSOLE}/deletions/{deletion_id}/report")
    report = browser.find_element("tag name", "main").text
    for app in APPS:
        line = next((l for l in report.splitlines() if app in l and "revoked" in l), None)
        assert line, f"the report shows no revocation outcome for {app}:\n{report}"
    assert sub not in report, "the evidence report holds no Apple sub"
    cookie = browser_cookie(browser)["value"]
    raw = request("GET", f"{CONSOLE}/deletions/{deletion_id}/report.json", headers={"Cookie": f"__Host-console={cookie}"})
    assert raw.status == 200 and sub not in raw.body
    evidence = json.loads(raw.body)
    text = json.dumps(evidence)
    for app in APPS:
        assert app in text, f"report.json names no outcome for {app}"
    # Art. 19: the backend subscribed to user.deleted was told, and the report says so.
    def told():
        browser.get(f"{CONSOLE}/deletions/{deletion_id}/report")
        rows = [r.text for r in browser.find_elements("css selector", "main tr") if subscription["id"] in r.text]
        return rows and "delivered" in rows[0]
    wait_for(told, what="the report to list the user.deleted delivery")
    receiver.shutdown()
    # The audit log names the operators: who opened the deletion, who retried it.
    browser.get(f"{CONSOLE}/audit?deletion_id={deletion_id}")
    rows = [r.text for r in browser.find_elements("css selector", "main tr")]
    assert any("console:dpo-journey" in r and "deletion_requested" in r for r in rows), rows
    assert any("console:ops-journey" in r and "retried" in r for r in rows), rows


def test_follow_up_opened_by_a_tokenless_deletion_and_closed_by_consent_revoked(browser):
    """TN3194: a user with no token to revoke must stop using Sign in with Apple in Settings; the
    follow-up stays open until Apple says so (consent-revoked for the same sub)."""
    user_id, sub = new_user(with_code=False)
    deletion_id = api_deletion(user_id, "follow-up fixture")
    wait_for(lambda: deletion(deletion_id)["state"] == "done", what="the tokenless deletion")
    sign_in_by_link(browser, "compliance", "dpo-follow-ups")

    def row():
        browser.get(CONSOLE + "/follow-ups")
        assert navigation_status(browser) == 200
        rows = [r.text for r in browser.find_elements("css selector", "main tr") if deletion_id in r.text]
        return rows[0] if rows else ""
    opened = row()
    assert opened and "open" in opened.lower(), f"no open follow-up for {deletion_id}: {opened!r}"
    notify("consent-revoked", sub)
    wait_for(lambda: "closed" in row().lower() or not row(), what="the follow-up to close")


def test_a_refused_revocation_is_never_worded_as_revoked():
    """Pitfall 6 of the design (a UI that reports success for a failed step): while Apple refuses,
    no timeline row of the deletion's page may say the token was revoked."""
    user_id, _ = new_user()
    faults(error_rate=1.0, error_statuses=[500], endpoints=["revoke"])
    try:
        deletion_id = api_deletion(user_id, "wording fixture")
        wait_for(lambda: deletion(deletion_id)["state"] == "failed", timeout=60, what="the failed deletion")
    finally:
        faults()
    page = link_session("viewer", "wording-viewer").get(f"/deletions/{deletion_id}").body
    rows = [re.sub(r"<[^>]+>", " ", row) for row in re.findall(r"<tr>(.*?)</tr>", page, re.S)]
    refused = [" ".join(row.split()) for row in rows if "will retry" in row]
    assert refused, "the timeline shows no refused revoke"
    claims = [row for row in refused if re.search(r"\brevoked\b", row)]
    assert not claims, f"rows say 'revoked' for a revoke Apple refused: {claims}"
