"""Headers, the role × route × method matrix, and CSRF, over plain HTTP (sessions from
`appleid-broker console link`); the cross-site form in Chromium."""
import json, re, urllib.parse, uuid
import pytest
from conftest import (sign_in_by_link, navigation_status, CONSOLE, IDP, BROKER, ConsoleClient, api_deletion, link_session, new_user,
                      request, wait_for)
from routes import ROLES, route_table

CSP = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"


@pytest.fixture(scope="module")
def sessions():
    return {role: link_session(role) for role in ROLES}


@pytest.fixture(scope="module")
def deletion_id():
    user_id, _ = new_user()
    return api_deletion(user_id, "access matrix fixture")


def concrete(pattern, deletion_id):
    return pattern.replace("{id}", deletion_id)


def test_every_console_response_carries_the_console_headers(sessions, deletion_id):
    client = sessions["compliance"]
    for method, pattern, roles, _ in route_table():
        if method != "GET":
            continue
        response = client.get(concrete(pattern, deletion_id))
        where = f"GET {pattern}"
        assert response.header("Content-Security-Policy") == CSP, where
        assert response.header("X-Content-Type-Options") == "nosniff", where
        assert response.header("Referrer-Policy") == "no-referrer", where
        assert response.header("Cross-Origin-Opener-Policy") == "same-origin", where
        assert response.header("Cache-Control") == "no-store", where
    # Unknown paths too (the console's own 404).
    assert request("GET", CONSOLE + "/no-such-page").header("Content-Security-Policy") == CSP


def test_console_routes_are_absent_from_the_public_api_listener():
    for path in ("/login", "/deletions", "/console.css", "/link"):
        response = request("GET", BROKER + path)
        assert response.status == 404, path
        assert response.header("Content-Security-Policy") != CSP, path


def test_role_route_method_matrix(sessions, deletion_id):
    """Every role × every route × GET/POST: a missing right is 403 with a page saying so,
    never an empty 200; a right gives anything but 403; a method not in the table is refused."""
    table = route_table()
    listed = {(method, pattern) for method, pattern, _, _ in table}
    failures = []
    for pattern in sorted({pattern for _, pattern, _, _ in table}):
        for method in ("GET", "POST"):
            path = concrete(pattern, deletion_id)
            entry = next((r for r in table if r[0] == method and r[1] == pattern), None)
            if (method, pattern) == ("POST", "/logout"):
                continue  # it would end the sessions the matrix uses (test_sign_out_ends_the_session)
            for role in ROLES:
                client = sessions[role]
                if method == "GET":
                    response = client.get(path)
                else:
                    response = client.post(path, {"csrf_token": client.csrf_for("/")})
                where = f"{role} {method} {pattern}: {response.status}"
                if entry is None:
                    if (method, pattern) not in listed and response.status not in (404, 405):
                        failures.append(where + " (not in the table: expected 404/405)")
                    continue
                roles = entry[2]
                if roles is not None and role not in roles:
                    if response.status != 403:
                        failures.append(where + " (expected 403)")
                    elif len(re.sub(r"<[^>]+>", "", response.body).strip()) < 20:
                        failures.append(where + " (403 with an empty page)")
                else:
                    # (Routes open to anyone refuse bad input themselves: an unknown link, a callback without state.)
                    if response.status == 403 and roles is not None:
                        failures.append(where + " (a right refused)")
                    if response.status == 200 and not response.body.strip():
                        failures.append(where + " (an empty 200)")
    assert not failures, "\n".join(failures)


def test_signed_out_requests_go_to_sign_in_or_are_refused(deletion_id):
    anonymous = ConsoleClient()
    for method, pattern, roles, _ in route_table():
        if roles is None:
            continue
        path = concrete(pattern, deletion_id)
        if method == "GET":
            response = anonymous.get(path)
            assert response.status in (302, 303) and response.header("Location") == "/login", (pattern, response.status)
        else:
            response = anonymous.post(path, {})
            assert response.status in (401, 403), (pattern, response.status)


def test_csrf_token_missing_or_from_another_session_is_refused(sessions):
    mine, other = sessions["compliance"], link_session("compliance", operator="another-compliance")
    fields = {"identify_by": "user_id", "value": "00000000-0000-4000-8000-000000000000"}
    missing = mine.post("/deletions/new", fields)
    assert missing.status == 403, missing.status
    foreign = mine.post("/deletions/new", {**fields, "csrf_token": other.csrf_for("/")})
    assert foreign.status == 403, foreign.status
    # The same request with the session's own token gets past the check (404: no such user).
    own = mine.post("/deletions/new", {**fields, "csrf_token": mine.csrf_for("/")})
    assert own.status == 404, own.status
    # Sign-out is a POST like any other.
    assert mine.post("/logout", {}).status == 403
    assert mine.get("/").status == 200


def test_sign_out_ends_the_session_on_the_server():
    client = link_session("viewer", operator="leaving-viewer")
    answer = client.post("/logout", {"csrf_token": client.csrf_for("/")})
    assert answer.status in (302, 303) and answer.header("Location") == "/login"
    # The old cookie, replayed, is no session any more.
    replay = client.get("/")
    assert replay.status in (302, 303) and replay.header("Location") == "/login"


def test_cross_site_form_from_the_identity_providers_origin_is_refused(browser):
    """A page on localhost auto-submits a form to the console: Chromium sends no SameSite=Strict
    cookie and says Sec-Fetch-Site: cross-site; the console refuses it with 403 even when the
    form carries the session's real CSRF token."""
    sign_in_by_link(browser, "compliance", "cross-site-victim")
    browser.get(CONSOLE + "/deletions/new")
    token = browser.find_element("css selector", 'input[name="csrf_token"]').get_attribute("value")
    fields = json.dumps({"csrf_token": token, "identify_by": "user_id", "value": "00000000-0000-4000-8000-000000000000"})
    browser.get(IDP + "/test/post?" + urllib.parse.urlencode({"action": CONSOLE + "/deletions/new", "fields": fields}))
    wait_for(lambda: browser.current_url.startswith(CONSOLE), what="the cross-site form to arrive")
    status = navigation_status(browser)
    assert status == 403, (status, browser.find_element("tag name", "body").text[:300])
    # The same form submitted from the console's own page gets past the check (404: no such user).
    browser.get(CONSOLE + "/deletions/new")
    browser.find_element("id", "value").send_keys("00000000-0000-4000-8000-000000000000")
    browser.find_element("css selector", "main form button[type=submit]").click()
    wait_for(lambda: "/deletions/new" in browser.current_url, what="the same-site form")
    assert navigation_status(browser) == 404


def test_no_e_mail_reaches_viewers_or_operators_and_lookups_audit_no_term(sessions, deletion_id):
    """Personal data only where needed: a viewer's and an operator's pages never hold a user's
    e-mail address; a compliance lookup by e-mail finds the user, and its audit row holds a keyed
    hash of the term, never the term."""
    email = f"privacy-{uuid.uuid4().hex[:10]}@example.com"
    user_id, _ = new_user(email=email)
    for role in ("viewer", "operator", "admin"):
        client = sessions[role]
        for method, pattern, roles, _ in route_table():
            if method == "GET" and (roles is None or role in roles):
                page = client.get(concrete(pattern, deletion_id)).body
                assert email not in page and email.split("@")[0] not in page, f"{role} GET {pattern} shows the e-mail"
    compliance = sessions["compliance"]
    found = compliance.post("/lookup", {"csrf_token": compliance.csrf_for("/lookup"), "identify_by": "email", "value": email})
    assert found.status == 200 and user_id in found.body, found.status
    assert email not in found.body, "the lookup's result shows the address unmasked"
    audit = compliance.get("/audit?action=console.lookup").body
    assert "console.lookup" in audit and email not in audit and email.split("@")[0] not in audit
