"""A relying party built on Authlib (PyPI), nobody's code here but the glue: the authorization
code flow with PKCE S256 against an OpenID Provider found by discovery, the ID token verified
by Authlib against the provider's JWKS (signature, iss, aud, exp, nonce, at_hash), userinfo,
refresh with rotation, RFC 7009 revocation; and the refusals a provider must make: a
redirect_uri that is not registered, a code used twice, a wrong PKCE verifier, a wrong client
secret, a refresh token used twice. Called by scripts/oidc-rps.sh.

Environment: OIDC_ISSUER, RP_CLIENT_ID, RP_CLIENT_SECRET, RP_REDIRECT_URI, RP_SCOPE,
OP_KIND (broker: sign-in through Apple's form post; glewlwyd: through Glewlwyd's login API
with GLEWLWYD_USER/GLEWLWYD_PASSWORD), RP_PUBLIC_CLIENT_ID (broker: a public client, for the
PKCE-required refusals)."""

import base64
import hashlib
import json
import os
import secrets
import sys
import traceback
import warnings
from urllib.parse import parse_qs, urlencode, urlparse

import requests
from authlib.integrations.requests_client import OAuth2Session
from authlib.integrations.base_client.errors import OAuthError
warnings.filterwarnings("ignore", message="authlib.jose module is deprecated")  # still Authlib's OIDC validator
from authlib.jose import JsonWebKey, jwt  # noqa: E402
from authlib.jose.errors import JoseError
from authlib.oidc.core import CodeIDToken

from browser import browser_for

ISSUER = os.environ["OIDC_ISSUER"].rstrip("/")
CLIENT_ID = os.environ["RP_CLIENT_ID"]
CLIENT_SECRET = os.environ["RP_CLIENT_SECRET"]
REDIRECT_URI = os.environ["RP_REDIRECT_URI"]
SCOPE = os.environ.get("RP_SCOPE", "openid")
OP_KIND = os.environ.get("OP_KIND", "broker")
BROKER = OP_KIND == "broker"

discovery = requests.get(ISSUER + "/.well-known/openid-configuration", timeout=10)
discovery.raise_for_status()
META = discovery.json()
assert META["issuer"] == ISSUER, f"discovery issuer {META['issuer']} is not {ISSUER}"
JWKS = JsonWebKey.import_key_set(requests.get(META["jwks_uri"], timeout=10).json())


def client(secret=CLIENT_SECRET, client_id=CLIENT_ID):
    return OAuth2Session(client_id, secret, scope=SCOPE, redirect_uri=REDIRECT_URI,
                         code_challenge_method="S256", token_endpoint_auth_method="client_secret_basic")


def browser():
    return browser_for(ISSUER, OP_KIND)


def authorize(rp=None, **extra):
    """Runs the front channel; returns (callback URL, state, nonce, code_verifier)."""
    rp = rp or client()
    verifier = secrets.token_urlsafe(48)
    nonce = secrets.token_urlsafe(16)
    uri, state = rp.create_authorization_url(META["authorization_endpoint"], nonce=nonce, code_verifier=verifier,
                                             **extra)
    person = browser()
    callback = person.navigate(uri, REDIRECT_URI)
    assert isinstance(callback, str), f"the flow did not reach the RP: {person.trail()}: {callback.text[:300]}"
    return callback, state, nonce, verifier


def query(url):
    return {key: values[0] for key, values in parse_qs(urlparse(url).query).items()}


def verify_id_token(id_token, nonce, access_token):
    claims = jwt.decode(id_token, JWKS, claims_cls=CodeIDToken,
                        claims_options={"iss": {"essential": True, "value": ISSUER},
                                        "aud": {"essential": True, "value": CLIENT_ID}},
                        claims_params={"nonce": nonce, "client_id": CLIENT_ID, "access_token": access_token})
    claims.validate()
    assert claims.header["alg"] == "RS256", f"ID token alg {claims.header['alg']}"
    assert claims.get("at_hash"), "no at_hash in the ID token"
    return claims


def sign_in(rp=None):
    """The whole code flow; returns (token answer, verified ID token claims)."""
    rp = rp or client()
    callback, state, nonce, verifier = authorize(rp)
    answer = query(callback)
    assert "code" in answer, f"no code in {callback}"
    if META.get("authorization_response_iss_parameter_supported"):
        assert answer.get("iss") == ISSUER, f"RFC 9207: iss {answer.get('iss')!r} in {callback}"
    token = rp.fetch_token(META["token_endpoint"], authorization_response=callback, state=state,
                           code_verifier=verifier)
    assert token["token_type"].lower() == "bearer" and token.get("expires_in"), f"token answer {token}"
    return token, verify_id_token(token["id_token"], nonce, token["access_token"])


def raw_exchange(code, verifier, redirect_uri=REDIRECT_URI, secret=CLIENT_SECRET):
    """A token request sent as-is (Authlib would refuse to send some of the wrong ones)."""
    return requests.post(META["token_endpoint"], auth=(CLIENT_ID, secret), timeout=10, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri, "code_verifier": verifier})


def refresh(refresh_token):
    return requests.post(META["token_endpoint"], auth=(CLIENT_ID, CLIENT_SECRET), timeout=10,
                         data={"grant_type": "refresh_token", "refresh_token": refresh_token})


def userinfo(access_token):
    return requests.get(META["userinfo_endpoint"], headers={"Authorization": f"Bearer {access_token}"}, timeout=10)


def error_of(response):
    try:
        return response.json().get("error")
    except ValueError:
        return None


DEVIATIONS = []


def refused(response, status, error, what):
    """Asserts the standard refusal. Against Glewlwyd (the harness's reference provider) a
    refusal with another status or error code is noted as its deviation; an acceptance fails."""
    if response.status_code == status and error_of(response) == error:
        return
    message = f"{what}: HTTP {response.status_code} {response.text[:200]!r}, not {status} {error}"
    if BROKER or response.status_code < 400:
        raise AssertionError(message)
    DEVIATIONS.append(message)


# ---------------------------------------------------------------------------------------------
def check_code_flow():
    token, claims = sign_in()
    info = userinfo(token["access_token"])
    assert info.status_code == 200, f"userinfo {info.status_code} {info.text[:200]}"
    assert info.json()["sub"] == claims["sub"], f"userinfo sub {info.json()} vs ID token {claims['sub']}"
    if BROKER:
        for claim in ("sid", "auth_time"):
            assert claim in claims, f"no {claim} in the ID token: {dict(claims)}"
        if "email" in SCOPE.split():
            assert claims.get("email") and "email_verified" in claims, f"email scope without email: {dict(claims)}"
    return f"sub {claims['sub']}, ID token verified by Authlib (RS256 via JWKS, iss, aud, nonce, at_hash), userinfo"


def check_tampered_id_token():
    token, _ = sign_in()
    header, payload, signature = token["id_token"].split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    body["sub"] = "someone-else"
    forged = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
    try:
        jwt.decode(f"{header}.{forged}.{signature}", JWKS)
    except JoseError:
        return "a changed ID token fails Authlib's signature check"
    raise AssertionError("a tampered ID token verified")


def check_refresh_rotation_and_reuse():
    token, claims = sign_in()
    first = token["refresh_token"]
    rotated = refresh(first)
    assert rotated.status_code == 200, f"refresh: {rotated.status_code} {rotated.text[:200]}"
    second = rotated.json()
    assert second.get("refresh_token") and second["refresh_token"] != first, "the refresh token was not rotated"
    assert userinfo(second["access_token"]).json()["sub"] == claims["sub"], "the refreshed access token's user"
    reused = refresh(first)
    refused(reused, 400, "invalid_grant", "a reused refresh token")
    if BROKER:
        # The issue's contract (RFC 9700 §4.14.2): reuse ends the grant, the rotated token too.
        after = refresh(second["refresh_token"])
        refused(after, 400, "invalid_grant", "the rotated token after a reuse")
        return "rotated on use; the old one reused is refused and ends the grant"
    return "rotated on use; the old one reused is refused"


def check_revocation():
    token, _ = sign_in()
    hint = {"token_type_hint": "refresh_token"}
    revoked = requests.post(META["revocation_endpoint"], auth=(CLIENT_ID, CLIENT_SECRET), timeout=10,
                            data={"token": token["refresh_token"], **hint})
    assert revoked.status_code == 200, f"revocation: {revoked.status_code} {revoked.text[:200]}"
    after = refresh(token["refresh_token"])
    refused(after, 400, "invalid_grant", "a revoked refresh token")
    revoked = requests.post(META["revocation_endpoint"], auth=(CLIENT_ID, CLIENT_SECRET), timeout=10,
                            data={"token": token["access_token"], "token_type_hint": "access_token"})
    assert revoked.status_code == 200, f"access token revocation: {revoked.status_code}"
    if BROKER:
        info = userinfo(token["access_token"])
        assert info.status_code == 401 and 'error="invalid_token"' in info.headers.get("WWW-Authenticate", ""), \
            f"userinfo with a revoked access token: {info.status_code} {info.headers}"
        return "RFC 7009: refresh token then refused; access token then 401 invalid_token at userinfo"
    return "RFC 7009: refresh token then refused"


def check_unregistered_redirect_uri():
    evil = "https://evil.example/cb"
    rp = OAuth2Session(CLIENT_ID, CLIENT_SECRET, scope=SCOPE, redirect_uri=evil, code_challenge_method="S256")
    uri, _ = rp.create_authorization_url(META["authorization_endpoint"], nonce="n", code_verifier=secrets.token_urlsafe(48))
    person = browser()
    answer = person.session.get(uri, allow_redirects=False, timeout=10)
    location = answer.headers.get("Location", "")
    assert not location.startswith(evil), f"redirected to an unregistered redirect_uri: {location}"
    if BROKER:
        assert answer.status_code == 400 and "html" in answer.headers.get("Content-Type", ""), \
            f"an unregistered redirect_uri: {answer.status_code} {answer.headers}"
    return f"an unregistered redirect_uri is never redirected to (HTTP {answer.status_code})"


def check_code_replay():
    rp = client()
    callback, state, nonce, verifier = authorize(rp)
    code = query(callback)["code"]
    first = raw_exchange(code, verifier)
    assert first.status_code == 200, f"first exchange: {first.status_code} {first.text[:200]}"
    issued = first.json()
    second = raw_exchange(code, verifier)
    refused(second, 400, "invalid_grant", "a replayed code")
    # RFC 6749 §4.1.2 / RFC 9700 §4.5: what the first use issued is revoked.
    after = refresh(issued["refresh_token"]) if issued.get("refresh_token") else None
    if after is not None:
        refused(after, 400, "invalid_grant", "the first use's refresh token after the replay")
    info = userinfo(issued["access_token"])
    assert info.status_code == 401, f"the first use's access token survived the replay: {info.status_code}"
    return "a second use is refused and revokes what the first use issued"


def check_token_request_refusals():
    results = []
    callback, _, _, verifier = authorize()
    code = query(callback)["code"]
    wrong_secret = raw_exchange(code, verifier, secret=CLIENT_SECRET + "x")
    refused(wrong_secret, 401, "invalid_client", "a wrong client secret")
    results.append("wrong client secret refused")
    callback, _, _, verifier = authorize()
    wrong_verifier = raw_exchange(query(callback)["code"], secrets.token_urlsafe(48))
    refused(wrong_verifier, 400, "invalid_grant", "a wrong code_verifier")
    results.append("PKCE mismatch refused")
    callback, _, _, verifier = authorize()
    other_uri = raw_exchange(query(callback)["code"], verifier, redirect_uri=REDIRECT_URI + "/other")
    refused(other_uri, 400, "invalid_grant", "another redirect_uri at the token endpoint")
    results.append("redirect_uri mismatch refused")
    return ", ".join(results)


def check_pkce_required_for_public_clients():
    public = os.environ["RP_PUBLIC_CLIENT_ID"]
    person = browser()
    base = {"response_type": "code", "client_id": public, "redirect_uri": REDIRECT_URI, "scope": "openid",
            "state": "s1", "nonce": "n1"}
    answers = []
    for extra, why in (({}, "no code_challenge"),
                       ({"code_challenge": "x" * 43, "code_challenge_method": "plain"}, "plain")):
        answer = person.session.get(META["authorization_endpoint"] + "?" + urlencode({**base, **extra}),
                                    allow_redirects=False, timeout=10)
        location = answer.headers.get("Location", "")
        assert location.startswith(REDIRECT_URI), f"{why}: {answer.status_code} {location}"
        fields = query(location)
        assert fields.get("error") == "invalid_request" and fields.get("state") == "s1", f"{why}: {location}"
        answers.append(why)
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    callback = person.navigate(META["authorization_endpoint"] + "?" + urlencode(
        {**base, "code_challenge": challenge, "code_challenge_method": "S256"}), REDIRECT_URI)
    assert isinstance(callback, str) and "code" in query(callback), f"public client with S256: {person.trail()}"
    exchanged = requests.post(META["token_endpoint"], timeout=10, data={
        "grant_type": "authorization_code", "client_id": public, "code": query(callback)["code"],
        "redirect_uri": REDIRECT_URI, "code_verifier": verifier})
    assert exchanged.status_code == 200 and exchanged.json().get("id_token"), f"public exchange: {exchanged.text[:200]}"
    return f"public client: {' and '.join(answers)} refused with invalid_request; S256 signs in"


CHECKS = [check_code_flow, check_tampered_id_token, check_refresh_rotation_and_reuse, check_revocation,
          check_unregistered_redirect_uri, check_code_replay, check_token_request_refusals]
if BROKER:
    CHECKS.append(check_pkce_required_for_public_clients)


def main():
    failed = 0
    for check in CHECKS:
        name = check.__name__.removeprefix("check_")
        try:
            print(f"authlib RP ({OP_KIND}) {name}: ok: {check()}", file=sys.stderr)
        except (AssertionError, OAuthError, JoseError, requests.RequestException, KeyError) as error:
            failed += 1
            print(f"authlib RP ({OP_KIND}) {name}: FAILED: {error!r}", file=sys.stderr)
            traceback.print_exc()
    if BROKER and not failed:
        print(f"authlib RP ({OP_KIND}): every refusal had its standard status and error code", file=sys.stderr)
    for deviation in DEVIATIONS:
        print(f"authlib RP ({OP_KIND}) deviation from the standard answer (refused all the same): {deviation}",
              file=sys.stderr)
    print(f"authlib RP ({OP_KIND}): {len(CHECKS) - failed}/{len(CHECKS)} checks passed", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
