"""The conditions of the OpenID Foundation's conformance suite (openid-certification/
conformance-suite, src/main/java/net/openid/conformance/condition/...) that the Basic, Config,
Form Post, RP-Initiated Logout and Back-Channel Logout OP plans call, ported one function per
Java class and named after it. Each raises ConditionError with the Java condition's message when
its check fails; what it checks, and how leniently, follows the Java source (read at the suite's
master, 2026). The suite's Environment becomes `env`, a dict holding the same keys: server,
server_jwks, client, authorization_endpoint_request, authorization_endpoint_response,
token_endpoint_response (+ _headers, _http_status), id_token ({value, header, claims}),
access_token, userinfo, first_id_token, ..."""

import base64
import hashlib
import json
import math
import os
import re
import time
import urllib.parse

from authlib.jose import JsonWebKey, JsonWebSignature
from authlib.jose.errors import JoseError

SCHEMA = os.path.join(os.path.dirname(__file__), "conformance", "oauth_authorization_server_metadata.json")


class ConditionError(Exception):
    pass


def fail(message, **details):
    raise ConditionError(message + ("" if not details else " " + json.dumps(details, default=str)[:600]))


def b64url_decode(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def jwt_to_object(token):
    """JWTUtil.jwtStringToJsonObjectForEnvironment: value, header, claims (no verification)."""
    parts = token.split(".")
    if len(parts) != 3:
        fail("Couldn't parse the token as a JWT", token=token[:80])
    try:
        return {"value": token, "header": json.loads(b64url_decode(parts[0])), "claims": json.loads(b64url_decode(parts[1]))}
    except (ValueError, json.JSONDecodeError):
        fail("Couldn't parse the token as a JWT", token=token[:80])


# ---- server configuration, keys (condition/common, condition/client) ----

def CheckServerConfiguration(env):
    for key in ("authorization_endpoint", "token_endpoint", "issuer"):
        value = env["server"].get(key)
        if not value:
            fail("Couldn't find required component", required=key)
        parsed = urllib.parse.urlparse(value)
        if not parsed.scheme or not parsed.netloc:
            fail("Couldn't parse key as URL", key=key, url=value)


def CheckForKeyIdInServerJWKs(env):
    keys = env["server_jwks"].get("keys")
    if keys is None:
        fail("keys entry not found in JWKs")
    if not isinstance(keys, list):
        fail("keys entry in JWKs is not an array")
    for key in keys:
        if not isinstance(key, dict):
            fail("invalid key in JWKs, not a JSON object")
        if not str(key.get("kid", "")).strip():
            fail("kid not found in key", key=key)


def CheckDistinctKeyIdValueInServerJWKs(env):
    kids = [key.get("kid") for key in env["server_jwks"].get("keys", []) if key.get("kid") is not None]
    if len(kids) != len(set(kids)):
        fail("Distinct 'kid' value in key", kids=kids)


def CheckServerKeysIsValid(env):
    try:
        JsonWebKey.import_key_set(env["server_jwks"])
    except (JoseError, ValueError, KeyError) as error:
        fail("Unable to parse JWK set", error=str(error))


PRIVATE_MEMBERS = {"d", "p", "q", "dp", "dq", "qi", "oth", "k"}


def EnsureJwksHasNoPrivateOrSymmetricKeyMaterial(env):
    for index, key in enumerate(env["server_jwks"].get("keys", [])):
        found = PRIVATE_MEMBERS & set(key)
        if found or key.get("kty") == "oct":
            fail("The JWK set in server JWKS contains private or symmetric key material; a published JWK set must contain public keys only.", index=index, members=sorted(found))


def ValidateJwksStructure(env):
    keys = env["server_jwks"].get("keys")
    if not isinstance(keys, list):
        fail("The JWK set in server JWKS does not contain a 'keys' array")
    required = {"RSA": ("n", "e"), "EC": ("crv", "x", "y"), "OKP": ("crv", "x"), "oct": ("k",)}
    for index, key in enumerate(keys):
        if not isinstance(key, dict) or "kty" not in key:
            fail("The JWK set in server JWKS is structurally invalid.", index=index, detail="has no kty")
        for member in required.get(key["kty"], ()):
            if member not in key:
                fail("The JWK set in server JWKS is structurally invalid.", index=index, detail=f"lacks {member}")


def ParseUsableJwksKeys(env):
    for index, key in enumerate(env["server_jwks"].get("keys", [])):
        if key.get("kty") in ("RSA", "EC"):
            try:
                JsonWebKey.import_key(key)
            except (JoseError, ValueError) as error:
                fail("The JWK set in server JWKS contains a key that should be usable but the JOSE library cannot parse.", index=index, error=str(error))


def WarnOnUnusableJwksKeys(env):
    for index, key in enumerate(env["server_jwks"].get("keys", [])):
        if key.get("kty") not in ("RSA", "EC", "OKP"):
            fail("The JWK set in server JWKS contains key(s) that the test suite cannot use.", index=index)


def verify_jws_signature(token, jwks, token_name, kid_required=False):
    """AbstractVerifyJwsSignature.verifyJwsSignature: the key named by kid (matching kty, and alg
    and use when the key has them) must verify the signature; alg none never verifies."""
    header = jwt_to_object(token)["header"]
    alg, kid = header.get("alg"), header.get("kid")
    kty = {"RS": "RSA", "PS": "RSA", "ES": "EC", "HS": "oct"}.get(str(alg)[:2])
    if alg == "none" or kty is None:
        fail(f"Error validating {token_name} signature", alg=alg)

    def selectable(key):
        return (key.get("kty") == kty and (key.get("alg") in (None, alg)) and key.get("use") in (None, "sig"))

    keys = jwks.get("keys", [])
    if kid:
        if sum(1 for key in keys if key.get("kid") == kid and key.get("alg") == alg and key.get("use") == "sig"
               and key.get("kty") == kty) > 1:
            fail("Found more than one key in server JWKS that has the right kid, kty, alg and 'use':'sig'")
        candidates = [key for key in keys if key.get("kid") == kid and selectable(key)]
        if not candidates:
            fail("server JWKS does not contain a key with the correct kid, kty that also matches (or does not have) alg/x5t#S256/'use':'sig'", kid=kid)
    else:
        if kid_required:
            fail("kid value in JWT header is missing/null/empty")
        candidates = [key for key in keys if selectable(key)]
        if not candidates:
            fail("server JWKS does not contain a key with the correct kty that also matches (or does not have) alg/x5t#S256/'use':'sig'")
    for key in candidates:
        try:
            JsonWebSignature(algorithms=[alg]).deserialize_compact(token, JsonWebKey.import_key(key))
            return
        except JoseError:
            continue
    fail(f"Unable to verify {token_name} signature based on server keys")


# ---- authorization endpoint response ----

def CheckMatchingCallbackParameters(env):
    expected = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(env["redirect_uri"]).query))
    for key, value in expected.items():
        if env["callback_query_params"].get(key) != value:
            fail("These parameters must be present in the redirect back, but they are not.", parameter=key)


def ValidateIssIfPresentInAuthorizationResponse(env):
    iss = env["authorization_endpoint_response"].get("iss")
    if iss is not None and iss != env["server"]["issuer"]:
        fail("'iss' parameter in authorization response does not match server's issuer value.", expected=env["server"]["issuer"], actual=iss)


def CheckIfAuthorizationEndpointError(env):
    if env["authorization_endpoint_response"].get("error"):
        fail("The authorization was expected to succeed, but the server returned an error from the authorization endpoint", response=env["authorization_endpoint_response"])


def CheckStateInAuthorizationResponse(env):
    actual, expected = env["authorization_endpoint_response"].get("state"), env.get("state")
    error = env["authorization_endpoint_response"].get("error")
    if not expected:
        if actual:
            fail("No state value was sent, but a state in response was returned")
        return
    if expected == actual:
        return
    if not actual and error in ("invalid_request_object", "invalid_request_uri"):
        return
    if not actual:
        fail("State was passed in request, but is missing from response (or returned in the wrong place)")
    fail("State in response did not match", expected=expected, actual=actual)


def ExtractAuthorizationCodeFromAuthorizationResponse(env):
    code = env["authorization_endpoint_response"].get("code")
    if not code:
        fail("Couldn't find authorization code")
    env["code"] = code


def shannon_bits(text):
    counts = {}
    for char in text:
        counts[char] = counts.get(char, 0) + 1
    return -sum(c / len(text) * math.log2(c / len(text)) for c in counts.values()) * len(text)


def EnsureMinimumAuthorizationCodeLength(env):
    code = env["authorization_endpoint_response"].get("code") or fail("Can't find authorization code")
    if len(code.encode()) * 8 < 128:
        fail("Authorization code is not long enough", actual_bits=len(code.encode()) * 8)


def EnsureMinimumAuthorizationCodeEntropy(env):
    code = env["authorization_endpoint_response"].get("code") or fail("Can't find authorization code")
    if not shannon_bits(code) > 96:
        fail("Calculated shannon entropy does not seem to meet minimum required entropy", actual=shannon_bits(code))


def CheckCallbackHttpMethodIsPost(env):
    if env["callback_http_method"] != "POST":
        fail("The HTTP method used at redirect_uri is not 'POST'", method=env["callback_http_method"])


def CheckCallbackContentTypeIsFormUrlEncoded(env):
    content_type = env["callback_headers"].get("content-type")
    if content_type is None:
        fail("content-type header to redirect_uri is missing")
    if content_type != "application/x-www-form-urlencoded":
        fail("content-type header to redirect_uri does not have the expected value", content_type=content_type)


def RejectAuthCodeInUrlQuery(env):
    if env["callback_query_params"].get("code"):
        fail("Authorization code is present in URL query returned from authorization endpoint")


def RejectErrorInUrlQuery(env):
    if env["callback_query_params"].get("error"):
        fail("'error' is present in URL query returned from authorization endpoint")


def EnsureErrorFromAuthorizationEndpointResponse(env):
    if "error" not in env["authorization_endpoint_response"]:
        fail("Authorization server was expected to return an error but did not", response=env["authorization_endpoint_response"])


def RejectAuthCodeInAuthorizationEndpointResponse(env):
    if env["callback_query_params"].get("code") is not None:
        fail("Authorization code is present in URL query but an error was expected")
    if env.get("callback_params", {}).get("code") is not None:
        fail("Authorization code is present in URL fragment returned from but an error was expected")


def CheckForUnexpectedParametersInErrorResponseFromAuthorizationEndpoint(env):
    response = env["authorization_endpoint_response"]
    if "error" not in response:
        fail("Authorization server was expected to return an error but did not")
    unexpected = {k: v for k, v in response.items() if k not in ("error", "error_description", "error_uri", "state", "session_state", "iss")}
    if unexpected:
        fail("error response includes unexpected parameters.", unexpected=unexpected)


def CheckErrorDescriptionFromAuthorizationEndpointResponseErrorContainsCRLFTAB(env):
    description = env["authorization_endpoint_response"].get("error_description") or ""
    if any(c in description for c in "\r\n\t"):
        fail("'error_description' field includes characters CR, LF or TAB, these are not recommended to include")


def valid_error_description(description):
    return re.fullmatch(r"[\x09\x0A\x0D\x20-\x21\x23-\x5B\x5D-\x7E]+", description) is not None


def ValidateErrorDescriptionFromAuthorizationEndpointResponseError(env):
    description = env["authorization_endpoint_response"].get("error_description")
    if description and not valid_error_description(description):
        fail("'error_description' field MUST NOT include characters outside the set %09-0A / %x0D / %x20-21 / %x23-5B / %x5D-7E")


def ValidateErrorUriFromAuthorizationEndpointResponseError(env):
    uri = env["authorization_endpoint_response"].get("error_uri")
    if uri and not re.fullmatch(r"[\x21\x23-\x5B\x5D-\x7E]+", uri):
        fail("'error_uri' field MUST NOT include characters outside the set %x21 / %x23-5B / %x5D-7E")


def CheckErrorFromAuthorizationEndpointErrorInvalidRequestOrUnsupportedResponseType(env):
    error = env["authorization_endpoint_response"].get("error")
    if not error:
        fail("Expected 'error' field not found")
    if error not in ("unsupported_response_type", "invalid_request"):
        fail("'error' field has unexpected value", actual=error)


def CheckErrorFromAuthorizationEndpointIsOneThatRequiredAUserInterface(env):
    error = env["authorization_endpoint_response"].get("error")
    if not error:
        fail("Expected 'error' field not found")
    if error not in ("interaction_required", "login_required", "account_selection_required", "consent_required"):
        fail("'error' field has an unexpected value", actual=error)


# ---- token endpoint ----

def CheckTokenEndpointHttpStatus200(env):
    if env["token_endpoint_response_http_status"] != 200:
        fail("Invalid http status", actual=env["token_endpoint_response_http_status"], expected=200)


def CheckTokenEndpointHttpStatus400(env):
    if env["token_endpoint_response_http_status"] != 400:
        fail("Invalid http status", actual=env["token_endpoint_response_http_status"], expected=400)


def CheckTokenEndpointReturnedJsonContentType(env):
    content_type = env["token_endpoint_response_headers"].get("content-type")
    if not content_type:
        fail("Couldn't find content-type header in token_endpoint_response_headers")
    if content_type.split(";")[0].strip() != "application/json":
        fail("Invalid content-type header in token_endpoint_response_headers", actual=content_type)


def CheckTokenEndpointCacheHeaders(env):
    cache_control = env["token_endpoint_response_headers"].get("cache-control")
    if cache_control is None:
        fail("token endpoint response does not contain 'cache-control' header")
    if "no-store" not in [piece.strip() for piece in cache_control.split(",")]:
        fail("'cache-control' header in token endpoint response does not contain expected value.", actual=cache_control)


def CheckIfTokenEndpointResponseError(env):
    if env["token_endpoint_response"].get("error"):
        fail("The token endpoint call was expected to succeed, but it returned an error response", response=env["token_endpoint_response"])


def CheckForAccessTokenValue(env):
    if not env["token_endpoint_response"].get("access_token"):
        fail("access_token is missing or empty in token endpoint response")
    if not env["token_endpoint_response"].get("token_type"):
        fail("token_type is missing or empty in token endpoint response")


def ExtractAccessTokenFromTokenResponse(env):
    env["access_token"] = {"value": env["token_endpoint_response"]["access_token"], "type": env["token_endpoint_response"].get("token_type")}


def ExtractExpiresInFromTokenEndpointResponse(env):
    if "expires_in" not in env["token_endpoint_response"]:
        fail("'expires_in' not present in the token endpoint response. RFC6749 recommends expires_in is included.")
    env["expires_in"] = env["token_endpoint_response"]["expires_in"]


def ValidateExpiresIn(env):
    value = env["expires_in"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail("expires_in is not a number")
    if int(value) <= 0:
        fail("expires_in must be positive")
    if value > 31536000:
        fail("expires_in is unreasonably large (more than 1 year)")


def CheckForRefreshTokenValue(env):
    if not env["token_endpoint_response"].get("refresh_token"):
        fail("refresh_token is missing or empty in token endpoint response")


def ExtractIdTokenFromTokenResponse(env):
    token = env["token_endpoint_response"].get("id_token")
    if not isinstance(token, str):
        fail("Couldn't find id_token in token_endpoint_response")
    env["id_token"] = jwt_to_object(token)


def ValidateIdToken(env):
    client_id, issuer, now = env["client"]["client_id"], env["server"]["issuer"], time.time()
    claims = env["id_token"]["claims"]
    skew = 300
    if "iss" not in claims:
        fail("'iss' claim missing")
    if claims["iss"] != issuer:
        fail("Issuer mismatch", expected=issuer, actual=claims["iss"])
    aud = claims.get("aud")
    if aud is None:
        fail("'aud' claim missing")
    if (client_id not in aud) if isinstance(aud, list) else (aud != client_id):
        fail("'aud' is not our client id", expected=client_id, actual=aud)
    exp = claims.get("exp")
    if exp is None:
        fail("'exp' claim missing")
    if now - skew > exp:
        fail("Token expired")
    if exp > now + 50 * 365 * 86400:
        fail("'exp' is unreasonably far in the future (more than 50 years)")
    iat = claims.get("iat")
    if iat is None:
        fail("'iat' claim missing")
    if now + skew < iat:
        fail("Token 'iat' in the future")
    if now - skew > iat:
        fail("Token 'iat' more than 5 minutes in the past")
    auth_time = claims.get("auth_time")
    if auth_time is not None:
        if now - 365 * 86400 > auth_time:
            fail("id_token auth_time is over a year in the past")
        if now + skew < auth_time:
            fail("id_token auth_time is in the future")
    if claims.get("acr") == "":
        fail("id_token acr is an empty string")


STANDARD_CLAIMS = {
    "sub": "string", "name": "string", "given_name": "string", "family_name": "string", "middle_name": "string",
    "nickname": "string", "preferred_username": "string", "profile": "string", "picture": "string", "website": "string",
    "email": "string", "email_verified": "boolean", "gender": "string", "birthdate": "birthdate", "zoneinfo": "string",
    "locale": "string", "phone_number": "string", "phone_number_verified": "boolean", "address": "address",
    "updated_at": "number", "_claim_names": "object", "_claim_sources": "object", "txn": "string",
}
ID_TOKEN_NON_IDENTITY_CLAIMS = ["iss", "aud", "exp", "iat", "auth_time", "nonce", "acr", "amr", "azp", "c_hash",
                                "at_hash", "s_hash", "jti", "nbf", "verified_claims"]


def valid_standard_claim(kind, value):
    if kind == "string":
        return isinstance(value, str) and value.strip() != "" and value.lower() != "null"
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "birthdate":
        return isinstance(value, str) and re.fullmatch(r"(\d{4}-\d{2}-\d{2}|\d{4})", value) is not None
    if kind == "address":
        return isinstance(value, dict) and len(value) > 0 and all(
            k not in ("formatted", "street_address", "locality", "region", "postal_code", "country") or valid_standard_claim("string", v)
            for k, v in value.items())
    return True


def validate_standard_claims(claims, what):
    """AbstractValidateOpenIdStandardClaims.ObjectValidator: known claims have their types; unknown ones are allowed."""
    if not isinstance(claims, dict) or not claims:
        fail(f"{what}: Not a JSON object or no identity claims")
    bad = [name for name, value in claims.items() if name in STANDARD_CLAIMS and not valid_standard_claim(STANDARD_CLAIMS[name], value)]
    if bad:
        fail(f"{what} claims are not valid", invalid=bad)


def ValidateIdTokenStandardClaims(env):
    claims = {k: v for k, v in env["id_token"]["claims"].items() if k not in ID_TOKEN_NON_IDENTITY_CLAIMS}
    validate_standard_claims(claims, "id_token")


def ValidateIdTokenNonce(env):
    incoming, expected = env["id_token"]["claims"].get("nonce"), env.get("nonce")
    if incoming is None and expected is None:
        return
    if expected != incoming:
        fail("Nonce values mismatch", actual=incoming, expected=expected)


def ValidateIdTokenACRClaimAgainstRequest(env):
    acr = env["id_token"]["claims"].get("acr")
    if acr is not None and not isinstance(acr, str):
        fail("acr value in id_token must be a string")
    claims = env["authorization_endpoint_request"].get("claims")
    requested = (json.loads(claims) if isinstance(claims, str) else (claims or {})).get("id_token", {}).get("acr", {})
    values = requested.get("values") or ([requested["value"]] if "value" in requested else [])
    if not values:
        return
    if acr is None:
        fail("One or more acr values were requested as an 'essential: true' claim so the acr used MUST be returned in the id_token")
    if acr not in values:
        fail("acr value in id_token is not (one of the) requested values")


def ValidateIdTokenSignature(env):
    verify_jws_signature(env["id_token"]["value"], env["server_jwks"], "id_token")


def CheckForSubjectInIdToken(env):
    sub = env["id_token"]["claims"].get("sub")
    if not sub:
        fail("id_token does not contain 'sub'")
    if len(sub) > 255:
        fail("id_token 'sub' exceeds 255 ASCII characters")
    for index, char in enumerate(sub):
        if ord(char) < 0x20:
            fail(f"id_token 'sub' contains non-printable character at offset {index}")
        if ord(char) >= 0x7F:
            fail(f"id_token 'sub' contains non-ASCII character at offset {index}")


def validate_updated_at(claims, where):
    updated_at = claims.get("updated_at")
    if updated_at is None:
        return
    if time.time() + 300 < updated_at:
        fail(f"updated_at in {where} appears to be in the future")
    if updated_at < 631152000:
        fail(f"updated_at in {where} appears to be prior to the year 1990")


def EnsureIdTokenUpdatedAtValid(env):
    validate_updated_at(env["id_token"]["claims"], "id_token")


def PerformStandardIdTokenChecks(module):
    """sequence/client/PerformStandardIdTokenChecks."""
    for condition in (ValidateIdToken, ValidateIdTokenStandardClaims, ValidateIdTokenNonce, ValidateIdTokenACRClaimAgainstRequest,
                      ValidateIdTokenSignature, CheckForSubjectInIdToken, EnsureIdTokenUpdatedAtValid):
        module.call(condition)


def half_hash(value):
    return base64.urlsafe_b64encode(hashlib.sha256(value.encode("ascii")).digest()[:16]).rstrip(b"=").decode()


def ExtractAtHash(env):
    if "at_hash" not in env["id_token"]["claims"]:
        env.pop("at_hash", None)
        fail("Couldn't find at_hash in ID token")
    env["at_hash"] = {"at_hash": env["id_token"]["claims"]["at_hash"], "alg": env["id_token"]["header"].get("alg")}


def ValidateAtHash(env):
    if not env["at_hash"].get("alg"):
        fail("Alg is null or empty. Invalid")
    expected = half_hash(env["access_token"]["value"])
    if env["at_hash"]["at_hash"] != expected:
        fail("Invalid at_hash in token", expected_hash=expected, id_token_hash=env["at_hash"]["at_hash"])


def ExtractCHash(env):
    if "c_hash" not in env["id_token"]["claims"]:
        env.pop("c_hash", None)
        fail("Couldn't find c_hash in ID token")
    env["c_hash"] = {"c_hash": env["id_token"]["claims"]["c_hash"], "alg": env["id_token"]["header"].get("alg")}


def ValidateCHash(env):
    if env["c_hash"]["c_hash"] != half_hash(env["authorization_endpoint_response"]["code"]):
        fail("Invalid c_hash in token")


def EnsureIdTokenDoesNotContainName(env):
    if env["id_token"]["claims"].get("name") is not None:
        fail("Unexpectedly found name in id_token. The conformance suite did not request the 'name' claim is returned in the id_token.")


SCOPE_STANDARD_CLAIMS = {
    "openid": ["sub"],
    "profile": ["name", "given_name", "family_name", "middle_name", "nickname", "profile", "picture", "website", "gender",
                "birthdate", "zoneinfo", "locale", "updated_at", "preferred_username"],
    "email": ["email", "email_verified"], "address": ["address"], "phone": ["phone_number", "phone_number_verified"],
    "offline_access": [],
}
ID_TOKEN_VALID_CLAIMS = ["iss", "sub", "aud", "exp", "iat", "auth_time", "nonce", "acr", "amr", "azp", "at_hash", "c_hash",
                         "nbf", "jti", "sid", "s_hash", "openbanking_intent_id", "txn"]


def EnsureIdTokenDoesNotContainNonRequestedClaims(env):
    valid = list(ID_TOKEN_VALID_CLAIMS)
    scopes = (env["authorization_endpoint_request"].get("scope") or "").split(" ")
    if "openid" in scopes:
        for scope in scopes:
            valid += SCOPE_STANDARD_CLAIMS.get(scope, [])
    extra = [key for key in env["id_token"]["claims"] if key not in valid]
    if extra:
        fail("id_token contains non-requested claims.", requested_scope=" ".join(scopes), extra=extra)


def verify_scopes_in_claims(env, claims, where):
    scope = env["authorization_endpoint_request"].get("scope")
    if not scope:
        fail("'scope' not found in authorization endpoint request")
    expected = [item for s in scope.split(" ") for item in SCOPE_STANDARD_CLAIMS.get(s, [])]
    missing = sorted(set(expected) - set(claims))
    if missing:
        fail(f"'claims' in {where} doesn't contain all scope items of scope in authorization request", missing_items=missing)


def CompareIdTokenClaims(env):
    first, second = env["first_id_token"]["claims"], env["second_id_token"]["claims"]
    for name in ("iss", "sub"):
        if name not in first or name not in second:
            fail(f"id token does not contain a {name} claim")
        if first[name] != second[name]:
            fail("Claim values are not the same", claim=name)
    if first.get("iat") == second.get("iat"):
        fail("iat for the second id token MUST represent the time that the new ID Token is issued")
    if sorted(first["aud"] if isinstance(first["aud"], list) else [first["aud"]]) != sorted(
            second["aud"] if isinstance(second["aud"], list) else [second["aud"]]):
        fail("aud Claim Value MUST be the same as in the ID Token issued when the original authentication occurred")
    if "auth_time" in second and first.get("auth_time") != second["auth_time"]:
        fail("auth_time claims are not the same")
    if ("azp" in second) != ("azp" in first) or first.get("azp") != second.get("azp"):
        fail("azp claims are not the same")


# ---- userinfo ----

def EnsureHttpStatusCodeIs200(env):
    if env["endpoint_response"]["status"] != 200:
        fail(f"{env['endpoint_response'].get('endpoint_name', 'endpoint')} endpoint returned an unexpected http status", actual=env["endpoint_response"]["status"])


def EnsureHttpStatusCodeIs4xx(env):
    status = env["endpoint_response"]["status"]
    if not 400 <= status <= 499:
        fail("endpoint returned a different http status than expected", actual=status, expected="400 to 499")


def EnsureContentTypeJson(env):
    content_type = env["endpoint_response"]["headers"].get("content-type")
    if not content_type:
        fail("Couldn't find content-type header in endpoint_response")
    if content_type.split(";")[0].strip() != "application/json":
        fail("Invalid content-type header in endpoint_response", actual=content_type)


def ExtractUserInfoFromUserInfoEndpointResponse(env):
    try:
        env["userinfo"] = json.loads(env["userinfo_endpoint_response_full"]["body"])
    except json.JSONDecodeError:
        fail("Couldn't parse the userinfo endpoint response as JSON")
    if not isinstance(env["userinfo"], dict):
        fail("userinfo is not a JSON object")


def ValidateUserInfoStandardClaims(env):
    validate_standard_claims(env["userinfo"], "Userinfo")


def EnsureUserInfoContainsSub(env):
    if not env["userinfo"].get("sub"):
        fail("sub not found in userinfo")


def EnsureUserInfoUpdatedAtValid(env):
    validate_updated_at(env["userinfo"], "userinfo")


def EnsureMemberValuesInClaimNameReferenceToMemberNamesInClaimSources(env):
    names, sources = env["userinfo"].get("_claim_names"), env["userinfo"].get("_claim_sources")
    if names is None and sources is None:
        return
    if names is None or sources is None:
        fail("userinfo response contains only one of _claim_names and _claim_sources")
    for source in sources:
        if source not in names.values():
            fail(f"Member name '{source}' in userinfo response '_claim_sources' is not referenced by member values in '_claim_names'")


def VerifyUserInfoAndIdTokenInTokenEndpointSameSub(env):
    if env["userinfo"].get("sub") != env["token_endpoint_id_token"]["claims"].get("sub"):
        fail("sub in userinfo and the id_token from the token endpoint differ")


def VerifyScopesReturnedInUserInfoClaims(env):
    verify_scopes_in_claims(env, env["userinfo"], "userinfo")


def EnsureUserInfoContainsName(env):
    if not env["userinfo"].get("name"):
        fail("name not found in userinfo")


def UserInfoEndpointWithAccessTokenInBodyNotSupported(env):
    fail("The userinfo endpoint did not accept the access token in the request body (not required by the standards)")


# ---- token endpoint errors ----

def CheckErrorFromTokenEndpointResponseErrorInvalidGrant(env):
    error = env["token_endpoint_response"].get("error")
    if error != "invalid_grant":
        fail("'error' field has unexpected value", expected="invalid_grant", actual=error)


def ValidateErrorFromTokenEndpointResponseError(env):
    error = env["token_endpoint_response"].get("error")
    if not error:
        fail("The authorization server was expected to return an error, but the 'error' field in the response is either null or empty")
    if not re.fullmatch(r"[\x20-\x21\x23-\x5B\x5D-\x7E]+", error):
        fail("'error' field MUST NOT include characters outside the set %x20-21 / %x23-5B / %x5D-7E")


def CheckErrorDescriptionFromTokenEndpointResponseErrorContainsCRLFTAB(env):
    description = env["token_endpoint_response"].get("error_description") or ""
    if any(c in description for c in "\r\n\t"):
        fail("'error_description' field includes characters CR, LF or TAB")


def ValidateErrorDescriptionFromTokenEndpointResponseError(env):
    description = env["token_endpoint_response"].get("error_description")
    if description and not valid_error_description(description):
        fail("'error_description' field MUST NOT include characters outside the allowed set")


def ValidateErrorUriFromTokenEndpointResponseError(env):
    uri = env["token_endpoint_response"].get("error_uri")
    if uri and not re.fullmatch(r"[\x21\x23-\x5B\x5D-\x7E]+", uri):
        fail("'error_uri' field MUST NOT include characters outside the allowed set")


def ServerAllowedReusingAuthorizationCode(env):
    fail("The authorization server allowed the authorization code to be used twice.")


# ---- second authorization ----

def CheckIdTokenAuthTimeClaimsSameIfPresent(env):
    first, second = env["first_id_token"]["claims"], env["id_token"]["claims"]
    if "auth_time" in first and "auth_time" in second and first["auth_time"] != second["auth_time"]:
        fail("The id_tokens contain different auth_time claims, but must contain the same auth_time.")


def CheckIdTokenSubConsistentForSecondAuthorization(env):
    if env["first_id_token"]["claims"]["sub"] != env["id_token"]["claims"]["sub"]:
        fail("The id_token from the first and second authorization contain different sub claims, but must contain the same sub.")


def CheckSecondIdTokenAuthTimeIsLaterIfPresent(env):
    first, second = env["first_id_token"]["claims"], env["id_token"]["claims"]
    if "auth_time" in first and "auth_time" in second:
        if first["auth_time"] == second["auth_time"]:
            fail("prompt=login means the server was required to reauthenticate the user, the id_token from the second authorization incorrectly has the same auth_time")
        if first["auth_time"] > second["auth_time"]:
            fail("The id_token from the second authorization incorrectly has an earlier auth_time than the id_token from the first authorization")


def CheckIdTokenAuthTimeClaimPresentDueToMaxAge(env):
    if "auth_time" not in env["id_token"]["claims"]:
        fail("auth_time claim is missing from the id_token, but it is required for a authentication where the max_age parameter was used")


def CheckIdTokenAuthTimeIsRecentIfPresent(env):
    auth_time = env["id_token"]["claims"].get("auth_time")
    if auth_time is not None and time.time() - 300 - 1 > auth_time:
        fail("id_token auth_time is older than 1 second (allowing 5 minutes skews)")


# ---- refresh tokens ----

def EnsureRefreshTokenContainsAllowedCharactersOnly(env):
    token = env["token_endpoint_response"].get("refresh_token")
    if token is not None and not re.fullmatch(r"[\x20-\x7E]+", token):
        fail("Refresh token contains illegal characters.")


def EnsureServerConfigurationSupportsRefreshToken(env):
    grants = env["server"].get("grant_types_supported")
    if grants is None:
        fail("The server issued a refresh token but does not claim to support this grant type (grant_types_supported in not present in the discovery document)")
    if not isinstance(grants, list):
        fail("supported_grant_types is present in the discovery document but is not an array")
    if "refresh_token" not in grants:
        fail("The server issued a refresh token but does not claim to support this grant type")


def CheckTokenTypeIsBearer(env):
    token_type = env["token_endpoint_response"].get("token_type")
    if not token_type:
        fail("Couldn't find token type")
    if token_type.lower() != "bearer":
        fail("Token type is not bearer")


def EnsureMinimumAccessTokenEntropy(env):
    token = env["token_endpoint_response"].get("access_token") or fail("Can't find access token")
    if not shannon_bits(token) > 96:
        fail("Calculated shannon entropy does not seem to meet minimum required entropy")


def EnsureAccessTokenContainsAllowedCharactersOnly(env):
    token = env["token_endpoint_response"].get("access_token")
    if token is None:
        fail("Token endpoint response does not contain an access_token")
    if not re.fullmatch(r"[\x20-\x7E]+", token):
        fail("Access token contains illegal characters.")


def EnsureMinimumRefreshTokenLength(env):
    token = env["token_endpoint_response"].get("refresh_token") or fail("Can't find refresh token")
    if len(token.encode()) * 8 < 128:
        fail("Refresh token is not of sufficient length")


def EnsureMinimumRefreshTokenEntropy(env):
    token = env["token_endpoint_response"].get("refresh_token") or fail("Can't find refresh token")
    if not shannon_bits(token) > 96:
        fail("Calculated shannon entropy does not seem to meet minimum required entropy")


# ---- discovery ----

def validate_json_array(env, name, values, minimum, message):
    """AbstractValidateJsonArray.validate (response types compare as sets of words)."""
    server = env["server"].get(name)
    if server is None:
        fail(f"{name}: not found")
    if not isinstance(server, list):
        fail(f"'{name}' should be an array")
    same = (lambda a, b: set(a.split(" ")) == set(b.split(" "))) if name == "response_types_supported" else (lambda a, b: a == b)
    if sum(1 for value in values if any(same(value, item) for item in server)) < minimum:
        fail(message, expected=values, actual=server)


def validate_json_boolean(env, name, default, required):
    value = env["server"].get(name)
    if value is None:
        if default != required:
            fail(f"'{name}' should be '{str(required).lower()}', but is absent and the default value is '{str(default).lower()}'.")
    elif not isinstance(value, bool):
        fail(f"{name}: incorrect type, must be a boolean.")
    elif value != required:
        fail(f"{name} must be: {str(required).lower()}")


def uri_is_valid_and_https(env, name):
    value = env["server"].get(name)
    if value is None:
        fail(f"{name}: URL not found")
    if not isinstance(value, str):
        fail(f"{name} is expected to be a string containing a URL")
    parsed = urllib.parse.urlparse(value)
    if not parsed.scheme or not parsed.netloc:
        fail(f"{name} is not a valid URL")
    if parsed.scheme != "https":
        fail(f"{name} must use the https scheme", actual=value)


def EnsureDiscoveryEndpointResponseStatusCodeIs200(env):
    if env["discovery_endpoint_response"]["status"] != 200:
        fail("Discovery endpoint did not return 200", actual=env["discovery_endpoint_response"]["status"])


def CheckDiscoveryEndpointReturnedJsonContentType(env):
    content_type = env["discovery_endpoint_response"]["headers"].get("content-type", "")
    if content_type.split(";")[0].strip() != "application/json":
        fail("Invalid content-type header in discovery_endpoint_response", actual=content_type)


def OIDCCCheckDiscEndpointResponseTypesSupported(env):
    validate_json_array(env, "response_types_supported", ["code", "code id_token", "id_token", "token id_token", "code id_token token", "code token"],
                        1, "The server must support at least one of the response types defined in OpenID Connect.")


def CheckDiscEndpointDiscoveryUrl(env):
    url = env["config"]["server"]["discoveryUrl"]
    parsed = urllib.parse.urlparse(url)
    if not parsed.path.endswith("/.well-known/openid-configuration"):
        fail("discoveryUrl is missing '/.well-known/openid-configuration'")
    if parsed.scheme != "https":
        fail("Expected https protocol for server.discoveryUrl")


def CheckDiscEndpointIssuer(env):
    issuer = env["server"].get("issuer")
    if issuer is None or isinstance(issuer, dict):
        fail("issuer is missing from discovery endpoint document")
    expected = env["config"]["server"]["discoveryUrl"]
    if expected.endswith(".well-known/openid-configuration"):
        expected = expected[: -len(".well-known/openid-configuration")]
    if issuer.rstrip("/") != expected.rstrip("/"):
        fail("issuer listed in the discovery document is not consistent with the location the discovery document was retrieved from.", issuer=issuer, discovery_url=expected)


def CheckDiscEndpointIssuerIsValidUrl(env):
    issuer = env["server"].get("issuer")
    if not isinstance(issuer, str):
        fail("issuer is missing or not a string in the authorization server metadata")
    parsed, issues = urllib.parse.urlparse(issuer), []
    if parsed.scheme.lower() != "https":
        issues.append("must use the https scheme")
    if not parsed.hostname:
        issues.append("is missing a host component")
    if parsed.fragment or "#" in issuer:
        issues.append("must not contain a fragment part")
    if parsed.query or "?" in issuer:
        issues.append("must not contain a query part")
    if parsed.username is not None:
        issues.append("must not contain userinfo")
    if issues:
        fail("issuer is not a valid RFC 8414 issuer identifier URL", issues=issues)


def _schema_errors(env):
    import jsonschema
    schema = json.load(open(SCHEMA))
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    return list(validator.iter_errors(env["server"]))


def ValidateServerMetadataAgainstSchema(env):
    structural = [e for e in _schema_errors(env) if e.validator != "additionalProperties"]
    if structural:
        fail("OAuth Authorization Server metadata does not match its JSON schema", errors=[e.message for e in structural][:5])


def CheckForUnexpectedParametersInServerMetadata(env):
    unknown = [e.message for e in _schema_errors(env) if e.validator == "additionalProperties"]
    if unknown:
        fail("Unknown properties were found in the OAuth Authorization Server metadata.", unknown=unknown)


def CheckDiscEndpointSubjectTypesSupported(env):
    validate_json_array(env, "subject_types_supported", ["public", "pairwise"], 1, "subject_types_supported is required to contain at least one of public or pairwise")


def OIDCCCheckDiscEndpointIdTokenSigningAlgValuesSupported(env):
    validate_json_array(env, "id_token_signing_alg_values_supported", ["RS256"], 1, "RS256 support is required")


def OIDCCCheckDiscEndpointUserinfoSigningAlgValuesSupported(env):
    values = env["server"]["userinfo_signing_alg_values_supported"]
    if not isinstance(values, list):
        fail("'userinfo_signing_alg_values_supported' should be an array")


def CheckDiscEndpointAuthorizationEndpoint(env):
    uri_is_valid_and_https(env, "authorization_endpoint")


def CheckDiscEndpointTokenEndpoint(env):
    uri_is_valid_and_https(env, "token_endpoint")


def CheckDiscEndpointUserinfoEndpoint(env):
    uri_is_valid_and_https(env, "userinfo_endpoint")


def CheckDiscEndpointRegistrationEndpoint(env):
    uri_is_valid_and_https(env, "registration_endpoint")


def CheckJwksUri(env):
    uri_is_valid_and_https(env, "jwks_uri")


def CheckDiscEndpointRequestParameterSupported(env):
    validate_json_boolean(env, "request_parameter_supported", False, True)


def CheckDiscEndpointRequestUriParameterSupported(env):
    validate_json_boolean(env, "request_uri_parameter_supported", True, True)


def CheckDiscEndpointRequestObjectSigningAlgValuesSupportedIncludesRS256(env):
    validate_json_array(env, "request_object_signing_alg_values_supported", ["RS256"], 1, "RS256 is not listed")


def CheckDiscEndpointClaimsParameterSupported(env):
    validate_json_boolean(env, "claims_parameter_supported", False, True)


def OIDCCCheckDiscEndpointClaimsSupported(env):
    validate_json_array(env, "claims_supported", [], 0, None)


def OIDCCCheckDiscEndpointGrantTypesSupported(env):
    grants = env["server"].get("grant_types_supported")
    if grants is not None:
        if not isinstance(grants, list):
            fail("grant_types_supported in discovery document, if present, must be an array.")
        if not grants:
            fail("grant_types_supported in discovery document must not be an empty array.")


def CheckDiscEndpointScopesSupportedContainsOpenId(env):
    validate_json_array(env, "scopes_supported", ["openid"], 1, "scopes_supported in the server's discovery document does not contain 'openid'.")


def CheckDiscEndpointScopesSupportedSyntax(env):
    scopes = env["server"].get("scopes_supported")
    if scopes is None:
        return
    if not isinstance(scopes, list):
        fail("scopes_supported is not a JSON array")
    bad = [s for s in scopes if not isinstance(s, str) or not re.fullmatch(r"[\x21\x23-\x5B\x5D-\x7E]+", s)]
    if bad:
        fail("Invalid scope syntax in authorization server scopes_supported", issues=bad)


def CheckDiscEndpointLocalesSyntax(env):
    for name in ("ui_locales_supported", "claims_locales_supported"):
        values = env["server"].get(name)
        if values is None:
            continue
        if not isinstance(values, list) or not all(isinstance(v, str) and re.fullmatch(r"[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*", v) for v in values):
            fail("Invalid BCP47 language tag(s) in authorization server metadata", field=name)


def CheckDiscEndpointLocalesCanonicalCasing(env):
    for name in ("ui_locales_supported", "claims_locales_supported"):
        for value in env["server"].get(name) or []:
            parts = value.split("-")
            if parts[0] != parts[0].lower():
                fail("Locale tag is not in canonical casing", tag=value)


def CheckDiscEndpointAllEndpointsAreHttps(env):
    for key in env["server"]:
        if key.endswith("_endpoint"):
            uri_is_valid_and_https(env, key)


def EnsureServerConfigurationCodeChallengeMethodsSupportedIsAnArray(env):
    values = env["server"].get("code_challenge_methods_supported")
    if values is None or values == []:
        return
    validate_json_array(env, "code_challenge_methods_supported", ["S256", "plain"], 1, "No matching value from server")


def EnsureServerConfigurationSupportsClientSecretBasic(env):
    if env["server"].get("token_endpoint_auth_methods_supported") is not None:
        validate_json_array(env, "token_endpoint_auth_methods_supported", ["client_secret_basic"], 1,
                            "server discovery document contains token_endpoint_auth_methods_supported which does not contain client_secret_basic")


def EnsureServerConfigurationSupportsClientSecretPost(env):
    if env["server"].get("token_endpoint_auth_methods_supported") is None:
        fail("server discovery document does not contain token_endpoint_auth_methods_supported (the default is client_secret_basic)")
    validate_json_array(env, "token_endpoint_auth_methods_supported", ["client_secret_post"], 1,
                        "server discovery document contains token_endpoint_auth_methods_supported which does not contain client_secret_post")


def OIDCCCheckScopesSupportedContainScopeTest(env):
    supported = env["server"].get("scopes_supported")
    expected = env["client"]["scope"].split(" ")
    if supported is None or not isinstance(supported, list) or any(scope not in supported for scope in expected):
        env["scopes_not_supported_flag"] = True
        fail("'scopes_support' in discovery document doesn't contain expected scopes", expected=expected, actual=supported)


def OIDCCCheckIdTokenSigningAlgValuesSupportedAlgNone(env):
    if "none" not in env["server"].get("id_token_signing_alg_values_supported", []):
        env["id_token_signing_alg_not_supported_flag"] = True
        fail("id_token_signing_alg_values_supported does not contain 'none'")


def CheckDiscEndSessionEndpoint(env):
    uri_is_valid_and_https(env, "end_session_endpoint")


def CheckDiscEndpointBackchannelLogoutSupported(env):
    validate_json_boolean(env, "backchannel_logout_supported", False, True)


def CheckDiscEndpointBackchannelLogoutSessionSupported(env):
    validate_json_boolean(env, "backchannel_logout_session_supported", False, True)


# ---- logout ----

def CheckPostLogoutState(env):
    state = env["post_logout_redirect"]["query_string_params"].get("state")
    if state is None:
        fail("state not present in query params passed to post logout redirect uri.")
    if state != env["end_session_state"]:
        fail("state in query params passed to post logout redirect uri does not match state passed in the end_session request.")


def CheckNoPostLogoutState(env):
    if env["post_logout_redirect"]["query_string_params"].get("state") is not None:
        fail("state present in query params passed to post logout redirect uri, but no state was passed to request.")


def CheckForUnexpectedParametersInPostLogoutRedirect(env):
    unexpected = {k: v for k, v in env["post_logout_redirect"]["query_string_params"].items() if k != "state"}
    if unexpected:
        fail("post_logout_redirect includes unexpected parameters in url query.", unexpected=unexpected)


def ExtractLogoutTokenFromBackchannelLogoutRequest(env):
    token = env["backchannel_logout_request"]["body_form_params"].get("logout_token")
    if not isinstance(token, str):
        fail("Couldn't find body_form_params.logout_token in backchannel_logout_request")
    env["logout_token"] = jwt_to_object(token)


def CheckForUnexpectedParametersInBackchannelLogoutRequest(env):
    unexpected = {k: v for k, v in env["backchannel_logout_request"]["body_form_params"].items() if k != "logout_token"}
    if unexpected:
        fail("backchannel_logout_request includes unexpected parameters.", unexpected=unexpected)


def ValidateLogoutTokenSignature(env):
    verify_jws_signature(env["logout_token"]["value"], env["server_jwks"], "logout_token")


def ValidateLogoutTokenClaims(env):
    claims, now = env["logout_token"]["claims"], time.time()
    if "iss" not in claims:
        fail("'iss' claim missing")
    if claims["iss"] != env["server"]["issuer"]:
        fail("Issuer mismatch")
    aud = claims.get("aud")
    if aud is None:
        fail("'aud' claim missing")
    client_id = env["client"]["client_id"]
    if (client_id not in aud) if isinstance(aud, list) else (aud != client_id):
        fail("'aud' is not our client id")
    iat = claims.get("iat")
    if iat is None:
        fail("'iat' claim missing")
    if now + 300 < iat:
        fail("Token 'iat' in the future")
    if now - 86400 > iat:
        fail("'iat' is more than 1 day in the past")
    if claims.get("jti") is None:
        fail("jti missing")
    events = claims.get("events")
    if events is None:
        fail("'events' claim missing")
    if not isinstance(events, dict):
        fail("'events' claim is not a json object")
    if len(events) != 1:
        fail("'events' object does not contain exactly 1 entry")
    value = events.get("http://schemas.openid.net/event/backchannel-logout")
    if value is None:
        fail("http://schemas.openid.net/event/backchannel-logout entry is missing from 'events' claim")
    if not isinstance(value, dict):
        fail("http://schemas.openid.net/event/backchannel-logout is not a json object")
    if value:
        fail("http://schemas.openid.net/event/backchannel-logout is not an empty object")


def CheckIdTokenSubMatchesLogoutToken(env):
    if env["id_token"]["claims"].get("sub") != env["logout_token"]["claims"].get("sub"):
        fail("The id_token and the logout_token contain different sub claims, but must contain the same sub.")


def CheckIdTokenSidMatchesLogoutToken(env):
    if env["id_token"]["claims"].get("sid") != env["logout_token"]["claims"].get("sid"):
        fail("The id_token and the logout_token contain different sid claims, but must contain the same sid.")


def CheckLogoutTokenNoNonce(env):
    if "nonce" in env["logout_token"]["claims"]:
        fail("Logout token has a nonce, which it must not.")


def CheckLogoutTokenHasSubOrSid(env):
    claims = env["logout_token"]["claims"]
    if "sub" not in claims and "sid" not in claims:
        fail("logout token has neither sub nor sid - it must have at least one of them.")
