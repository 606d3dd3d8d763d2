"""The console's route table as docs/console.md gives it to people (its "Routes" table: method,
path, roles, step-up): the tests read it, so a route that the console serves differently from
what the documentation says fails the matrix test."""
import os, re

ROLES = ("viewer", "operator", "compliance", "admin")
DOC = os.environ.get("CONSOLE_ROUTE_DOC") or os.path.join(os.path.dirname(__file__), "..", "..", "docs", "console.md")


def cells(line):
    # A cell may hold an escaped pipe (`csv\\|jsonl`).
    return [cell.replace("\\|", "|").strip().strip("`").strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def route_table():
    """[(method, pattern, roles or None for anyone, step_up)]: the rows of the table whose header
    starts `| method | path | roles |`; a path's example query (`?state=…`) is dropped."""
    routes, columns = [], None
    for line in open(DOC, encoding="utf-8"):
        if not line.startswith("|"):
            columns = None
            continue
        row = cells(line)
        if [c.lower() for c in row[:3]] == ["method", "path", "roles"]:
            columns = [c.lower() for c in row]
            continue
        if columns is None or row[0] not in ("GET", "POST"):
            continue
        entry = dict(zip(columns, row))
        who = entry["roles"].lower()
        if who == "anyone":
            roles = None
        elif who in ("all roles", "every role", "signed in"):
            roles = set(ROLES)
        else:
            roles = {role for role in ROLES if re.search(rf"\b{role}\b", who)}
            assert roles, f"docs/console.md: no role named in {line!r}"
        routes.append((row[0], entry["path"].split("?")[0], roles, entry.get("step-up", "").lower() == "yes"))
    assert routes, "docs/console.md has no route table (| method | path | roles | …)"
    return routes
