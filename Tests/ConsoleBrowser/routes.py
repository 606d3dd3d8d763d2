"""The console's route table as docs/console.md gives it to people: the tests read it, so a route
added to the console without a line there (or the reverse) fails the matrix test."""
import os, re

ROLES = ("viewer", "operator", "compliance", "admin")
DOC = os.environ.get("CONSOLE_ROUTE_DOC") or os.path.join(os.path.dirname(__file__), "..", "..", "docs", "console.md")


def route_table():
    """[(method, pattern, roles or None for anyone, step_up)] from the table whose rows start
    with `| GET |` or `| POST |` in docs/console.md."""
    routes = []
    for line in open(DOC, encoding="utf-8"):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0].strip("`") not in ("GET", "POST"):
            continue
        method, pattern = cells[0].strip("`"), cells[1].strip("`")
        who = cells[2].lower()
        if "anyone" in who:
            roles = None
        elif "signed-in" in who or "every role" in who or "all" == who.strip():
            roles = set(ROLES)
        else:
            roles = {role for role in ROLES if re.search(rf"\b{role}\b", who)}
            assert roles, f"docs/console.md: no role named in {line!r}"
        step_up = any("step-up" in cell.lower() for cell in cells[3:])
        routes.append((method, pattern, roles, step_up))
    assert routes, "docs/console.md has no route table (rows like | GET | /path | roles |)"
    return routes
