#!/usr/bin/env python3
"""The requests schemathesis once failed on, pinned as explicit cases so that they are sent on
every run, whatever the seed draws. Each goes to a live broker and its answer is checked with
schemathesis's own response checks against the served docs/openapi.json (status documented,
content type, headers, body schema), and for what the case is about. Run by
scripts/api-conformance.sh before the seeded exploration; a finding of `make fuzz-api` is fixed
and then added here.

    api-cases.py BASE_URL      (environment: API_KEY; schemathesis.toml is read for its settings)

Prints one line per case and exits 1 when one fails.
"""
import os
import sys

import jsonschema
import schemathesis

BASE = sys.argv[1].rstrip("/")
AUTH = {"Authorization": f"Bearer {os.environ['API_KEY']}"}
CASES = []


def case(name, origin):
    """Registers a case: a function returning a detail, raising when the answer is wrong."""
    def register(function):
        CASES.append((name, origin, function))
        return function
    return register


config = schemathesis.Config.from_path("schemathesis.toml")
schema = schemathesis.openapi.from_url(BASE + "/openapi.json", config=config)
raw = schema.raw_schema


def parameter_schema(path, method, name):
    for parameter in raw["paths"][path][method].get("parameters", []):
        if parameter.get("name") == name:
            return parameter["schema"]
    raise KeyError(f"{method.upper()} {path} documents no parameter {name}")


@case("every GET that documents a 414, with every query parameter over-long",
      "ST104: libmicrohttpd's 414 has no Content-Type (GET /authorize, then GET /logout)")
def over_long_queries():
    checked = []
    for path, methods in raw["paths"].items():
        get = methods.get("get")
        if not get or "414" not in get.get("responses", {}):
            continue
        names = [p["name"] for p in get.get("parameters", []) if p.get("in") == "query"]
        assert names, f"GET {path} documents a 414 but no query parameter"
        # 20 KiB each: far past the 48 KiB a connection's memory holds for the request line.
        over_long = schema[path]["GET"].Case(query={name: "x" * 20480 for name in names})
        response = over_long.call_and_validate(base_url=BASE)
        assert response.status_code == 414, f"GET {path}: status {response.status_code}"
        checked.append(f"{path} ({len(names)} parameters)")
    assert "/authorize" in " ".join(checked), "GET /authorize no longer documents its 414"
    return "414 as documented: " + ", ".join(checked)


@case("GET /v1/users/{id}/credential-state: the schema's client id rule is the code's", "ST202")
def credential_state_client_id():
    user = os.environ["CONFORMANCE_USER_ID"]
    rule = parameter_schema("/v1/users/{id}/credential-state", "get", "client_id")
    operation = schema["/v1/users/{id}/credential-state"]["GET"]
    candidates = ["com.example.app", "a", "A" * 255, "com.Example-app.web2", "-.", "A" * 256, "é" * 200, "com.example app",
                  "com/example", "com.example.app\u00e9", "\u0661\u0662", "com.example_app", "", "%", "a;b"]
    checked = 0
    for client_id in candidates:
        valid = jsonschema.Draft202012Validator(rule, format_checker=jsonschema.FormatChecker()).is_valid(client_id)
        response = operation.Case(path_parameters={"id": user}, query={"client_id": client_id}).call_and_validate(
            base_url=BASE, headers=AUTH)
        code = response.json().get("code") if response.status_code == 400 else None
        if valid:
            assert response.status_code == 200, f"schema-valid client_id {client_id!r} answered {response.status_code} {code}"
        else:
            assert (response.status_code, code) == (400, "invalid_client_id"), (
                f"schema-invalid client_id {client_id!r} answered {response.status_code} {code}")
        checked += 1
    return f"{checked} client ids, each accepted exactly when the schema accepts it"


@case("every admin list refuses limit=null", "ST201: /v1/oidc-logout-deliveries took limit=null as 100 (498af1f)")
def limit_null():
    listed = []
    for path, methods in raw["paths"].items():
        get = methods.get("get")
        if not get or "{" in path or not any(p.get("name") == "limit" for p in get.get("parameters", [])):
            continue
        response = schema[path]["GET"].Case(query={"limit": "null"}).call_and_validate(base_url=BASE, headers=AUTH)
        code = response.json().get("code") if response.headers.get("Content-Type", "").endswith("json") else None
        assert response.status_code == 400, f"GET {path}?limit=null answered {response.status_code} {code}"
        listed.append(path)
    assert listed, "no list operation with a limit parameter was found"
    return f"{len(listed)} lists: {', '.join(listed)}"


def describe(error):
    """A failure in a few lines: schemathesis's check codes and titles, not its curl line."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(describe(inner) for inner in error.exceptions)
    code = getattr(error, "code", None)
    title = getattr(error, "title", None)
    if code and title:
        return f"{code} {title}"
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 500 else text[:500] + "…"


failures = 0
for name, origin, function in CASES:
    try:
        detail = function()
        print(f"ok    {name} ({origin}){': ' + detail if detail else ''}")
    except (Exception, BaseExceptionGroup) as error:  # schemathesis's FailureGroup, AssertionError, …
        failures += 1
        print(f"FAIL  {name} ({origin}): {describe(error)}")
print(f"api-cases: {len(CASES) - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
