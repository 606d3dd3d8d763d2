"""Every console page in Chromium, for every role: zero Content-Security-Policy violations in the
browser's log and zero axe-core violations (WCAG 2.0/2.1/2.2 A and AA); and a page on another
site cannot frame the console."""
import pytest
from conftest import (sign_in_by_link, navigation_status, CONSOLE, IDP, api_deletion, axe_violations,
                      console_messages, csp_violations, faults, new_user, deletion, wait_for)
from routes import ROLES, route_table

# Not pages: the stylesheet, the JSON report, and the start of the OIDC redirect (another site).
NOT_HTML = {"/console.css", "/deletions/{id}/report.json", "/login/oidc"}


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
    return {"done": done, "failed": failed}




def check_page(browser, path, failures, axe=True):
    console_messages(browser)  # drop what came before
    browser.get(CONSOLE + path)
    violations = csp_violations(console_messages(browser))
    if violations:
        failures.append(f"{path}: CSP violations {violations}")
    if axe:
        found = axe_violations(browser)
        if found:
            failures.append(f"{path}: axe {[(v['id'], v['help'], v['nodes'][:2]) for v in found]}")


def pages_for(role, deletions):
    paths = []
    for method, pattern, roles, _ in route_table():
        if method != "GET" or pattern in NOT_HTML:
            continue
        if "{id}" in pattern:
            paths += [pattern.replace("{id}", deletions[state]) for state in ("done", "failed")]
        else:
            paths.append(pattern)
    paths.append("/deletions?state=failed")
    return paths


@pytest.mark.parametrize("role", ROLES)
def test_every_page_has_no_csp_violation_and_no_axe_violation(browser, role, deletions):
    sign_in_by_link(browser, role)
    failures = []
    for path in pages_for(role, deletions):  # pages the role may not see are its 403 pages
        check_page(browser, path, failures)
    # Forms' answers: the confirmation page of a new deletion (compliance).
    if role == "compliance":
        user_id, _ = new_user(client_ids=("com.example.app", "com.example.other"))
        browser.get(CONSOLE + "/deletions/new")
        browser.find_element("id", "value").send_keys(user_id)
        console_messages(browser)
        browser.find_element("css selector", "main form button[type=submit]").click()
        wait_for(lambda: "Confirm" in browser.title, what="the confirmation page")
        violations = csp_violations(console_messages(browser))
        if violations:
            failures.append(f"confirmation page: CSP violations {violations}")
        found = axe_violations(browser)
        if found:
            failures.append(f"confirmation page: axe {[(v['id'], v['help'], v['nodes'][:2]) for v in found]}")
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
