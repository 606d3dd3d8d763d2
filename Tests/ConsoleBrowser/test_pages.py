"""Every console page in Chromium, for every role: zero Content-Security-Policy violations in the
browser's log and zero axe-core violations (WCAG 2.0/2.1/2.2 A and AA); and a page on another
site cannot frame the console."""
import re
import pytest
from conftest import (sign_in_by_link, navigation_status, CONSOLE, IDP, api, api_deletion, axe_violations,
                      console_messages, csp_violations, faults, new_user, deletion, wait_for)
from routes import ROLES, route_table

# Not pages: the stylesheet, the JSON report, the audit export (a download), and the OIDC
# redirects to the provider (another site; the sign-in tests follow them).
NOT_HTML = {"/console.css", "/deletions/{id}/report.json", "/audit/export", "/login/oidc", "/step-up"}


@pytest.fixture(scope="module")
def deletions():
    """A done deletion and a failed one, so the detail, retry and report pages show both states."""
    done_user, _ = new_user()
    done = api_deletion(done_user, "page tour: done")
    wait_for(lambda: deletion(done)["state"] == "done", what="the done deletion")
    faults(error_rate=1.0, endpoints=["revoke"])
    try:
        failed_user, _ = new_user()
        failed = api_deletion(failed_user, "page tour: failed")
        wait_for(lambda: deletion(failed)["state"] == "failed", timeout=60, what="the failed deletion")
    finally:
        faults()
    # A webhook subscription whose receiver is down, so the webhooks page has a subscription and
    # dead letters, and the API keys page a key.
    status, answer = api("POST", "/v1/webhook-subscriptions", {"url": "http://127.0.0.1:9/down", "topics": ["user.deleted"]})
    assert status in (200, 201), answer
    return {"done": done, "failed": failed}




def check_shown_page(browser, label, failures, axe=True):
    """The page now shown: no CSP violation logged since the last read of the log, no axe violation."""
    violations = csp_violations(console_messages(browser))
    if violations:
        failures.append(f"{label}: CSP violations {violations}")
    if axe:
        found = axe_violations(browser)
        if found:
            failures.append(f"{label}: axe {[(v['id'], v['help'], v['nodes'][:2]) for v in found]}")


def check_page(browser, path, failures, axe=True):
    console_messages(browser)  # drop what came before
    browser.get(CONSOLE + path)
    check_shown_page(browser, path, failures, axe)


def submit_and_check(browser, path, value, arrived, label, failures):
    """Types a value into a page's form, submits it, and checks the answer page."""
    browser.get(CONSOLE + path)
    browser.find_element("id", "value").send_keys(value)
    console_messages(browser)
    browser.find_element("css selector", "main form button[type=submit]").click()
    wait_for(lambda: arrived(browser), what=label)
    check_shown_page(browser, label, failures)


def pages_for(browser, deletions):
    """Every GET page of the table; an {id} is a done and a failed deletion for deletions, and
    for other kinds the first such link on the list pages (a compliance or admin session sees
    them; others get the page's 403, which must be as clean)."""
    paths, with_ids = ["/deletions?state=failed"], []
    for method, pattern, roles, _ in route_table():
        if method != "GET" or pattern in NOT_HTML:
            continue
        if pattern.startswith("/deletions/{id}"):
            paths += [pattern.replace("{id}", deletions[state]) for state in ("done", "failed")]
        elif "{id}" in pattern:
            with_ids.append(pattern)
        else:
            paths.append(pattern)
    return paths, with_ids


def link_for(pattern, html):
    regex = re.escape(pattern).replace(re.escape("{id}"), "[0-9A-Za-z_-]+")
    match = re.search(f'href="({regex})"', html)
    return match.group(1) if match else None


@pytest.mark.parametrize("role", ROLES)
def test_every_page_has_no_csp_violation_and_no_axe_violation(browser, role, deletions):
    sign_in_by_link(browser, role)
    failures = []
    paths, with_ids = pages_for(browser, deletions)
    seen = ""
    for path in paths:  # pages the role may not see are its 403 pages
        check_page(browser, path, failures)
        seen += browser.page_source
    for pattern in with_ids:
        path = link_for(pattern, seen) or pattern.replace("{id}", deletions["done"])  # none: the 403/404 page
        check_page(browser, path, failures)
    # Forms' answers: the confirmation page of a new deletion (compliance).
    if role == "compliance":
        user_id, _ = new_user(client_ids=("com.example.app", "com.example.other"))
        submit_and_check(browser, "/deletions/new", user_id, lambda b: "Confirm" in b.title, "the confirmation page", failures)
        submit_and_check(browser, "/lookup", user_id, lambda b: "/lookup" in b.current_url and b.find_elements("css selector", "main table"),
                         "the lookup's masked results", failures)
    assert not failures, "\n".join(failures)


def test_signed_out_pages_have_no_csp_violation_and_no_axe_violation(browser):
    failures = []
    for path in ("/login", "/link?token=not-a-token", "/callback"):
        check_page(browser, path, failures)
    assert not failures, "\n".join(failures)


def test_a_page_on_another_site_cannot_frame_the_console(browser):
    sign_in_by_link(browser, "viewer")
    console_messages(browser)
    browser.get(IDP + "/test/frame?url=" + CONSOLE + "/")
    messages = wait_for(lambda: [m for m in console_messages(browser) if "frame-ancestors" in m], what="Chromium's frame-ancestors refusal")
    assert any("frame-ancestors 'none'" in m and "blocked" in m for m in messages), messages
    browser.switch_to.frame("victim")
    assert "Overview" not in browser.find_element("tag name", "html").text
    browser.switch_to.default_content()


def test_an_unknown_console_path_is_an_accessible_html_page(browser):
    """A browser that follows a stale link gets a page (title, language, a way back), not JSON."""
    sign_in_by_link(browser, "viewer", "lost-viewer")
    failures = []
    check_page(browser, "/no-such-page", failures)
    assert navigation_status(browser) == 404
    assert not failures, "\n".join(failures)


def test_overview_charts_render_in_chromium(browser, deletions):
    """The overview's pictures of the last days (issue 38, item 9): five server-rendered SVG charts,
    coloured by the console's own stylesheet (the CSP allows no inline style, so a colour on a bar
    proves the sheet applies), with their figures in tables; no CSP violation, no axe violation,
    also with every figures table opened."""
    sign_in_by_link(browser, "viewer", "chart-viewer")
    console_messages(browser)
    browser.get(CONSOLE + "/")
    charts = browser.find_elements("css selector", "main figure.chart svg[role=img]")
    assert len(charts) == 5, len(charts)
    labels = [chart.get_attribute("aria-label") for chart in charts]
    assert all(label and "last 14 days" in label for label in labels), labels
    bars = browser.find_elements("css selector", "#chart-deletions svg rect")
    assert bars, "the done and the failed deletion of today draw bars"
    fills = {browser.execute_script("return getComputedStyle(arguments[0]).fill", bar) for bar in bars}
    assert fills and not (fills & {"rgb(0, 0, 0)", "none", ""}), fills
    failures = []
    check_shown_page(browser, "/ (charts)", failures)
    for summary in browser.find_elements("css selector", "main figure.chart details summary"):
        summary.click()
    tables = browser.find_elements("css selector", "main figure.chart details[open] table")
    assert len(tables) == 5 and all(len(t.find_elements("css selector", "tbody tr")) == 14 for t in tables)
    check_shown_page(browser, "/ (charts, figures open)", failures)
    assert not failures, failures

