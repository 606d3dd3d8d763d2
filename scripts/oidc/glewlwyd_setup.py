"""Configures a fresh Glewlwyd through its admin API, as its own web console would: the OIDC
plugin (RS256 with the given 2048-bit key, PKCE, one-use rotated refresh tokens, code replay
revokes), one user with a password and the `openid` scope, one confidential client
(client_secret_basic) with the given redirect URIs, and the user's consent for that client.

    glewlwyd_setup.py BASE_URL KEY_PEM PUBLIC_PEM REDIRECT_URI...
Reads GLEWLWYD_USER/_PASSWORD and GLEWLWYD_CLIENT_ID/_SECRET from the environment."""

import os
import sys

import requests


def plugin_parameters(issuer, key, public):
    return {
        "jwt-type": "rsa", "jwt-key-size": "256", "key": key, "cert": public,
        "jwks-uri": "", "jwks-private": "", "default-kid": "", "client-sign_kid-parameter": "",
        "jwks-public": "", "jwks-public-uri": "", "jwks-show": True, "jwks-x5c": [],
        "iss": issuer, "secret-type": "public",
        "access-token-duration": 3600, "refresh-token-duration": 1209600, "code-duration": 600,
        "refresh-token-rolling": True, "refresh-token-one-use": "always",
        "client-refresh-token-one-use-parameter": "refresh-token-one-use",
        "allow-non-oidc": False, "auth-type-code-enabled": True, "auth-type-code-revoke-replayed": True,
        "auth-type-token-enabled": False, "auth-type-id-token-enabled": False, "auth-type-none-enabled": False,
        "auth-type-password-enabled": False, "auth-type-client-enabled": False, "auth-type-device-enabled": False,
        "auth-type-refresh-enabled": True,
        "scope": [], "additional-parameters": [], "claims": [],
        "service-documentation": "", "op-policy-uri": "", "op-tos-uri": "",
        "request-parameter-allow": False, "request-uri-allow-https-non-secure": False,
        "address-claim": {"type": "no", "formatted": "", "street_address": "", "locality": "", "region": "",
                          "postal_code": "", "country": "", "mandatory": False},
        "name-claim": "on-demand", "name-claim-scope": [], "email-claim": "on-demand", "email-claim-scope": [],
        "scope-claim": "no", "scope-claim-scope": [], "allowed-scope": ["openid"],
        "pkce-allowed": True, "pkce-method-plain-allowed": False,
        "introspection-revocation-allowed": True, "introspection-revocation-auth-scope": [],
        "introspection-revocation-allow-target-client": True,
        "register-client-allowed": False, "register-client-auth-scope": [], "register-client-credentials-scope": [],
        "register-client-management-allowed": False, "register-resource-specify-allowed": False,
        "register-resource-default": [], "session-management-allowed": True,
        "session-cookie-name": "GLEWLWYD2_OIDC_SID", "session-cookie-expiration": 2419200,
        "front-channel-logout-allowed": False, "back-channel-logout-allowed": False,
        "client-pubkey-parameter": "", "client-jwks-parameter": "jwks", "client-jwks_uri-parameter": "jwks_uri",
        "request-maximum-exp": 3600, "encrypt-out-token-allow": False,
        "device-authorization-expiration": 600, "device-authorization-interval": 5,
        "client-cert-header-name": "SSL_CLIENT_CERT", "client-cert-use-endpoint-aliases": False,
        "client-cert-self-signed-allowed": False, "oauth-dpop-allowed": False, "oauth-dpop-iat-duration": 10,
        "resource-allowed": False, "resource-scope": {}, "resource-client-property": "",
        "resource-scope-and-client-property": False, "resource-change-allowed": False,
        "oauth-rar-allowed": False, "rar-types-client-property": "authorization_data_types",
        "rar-allow-auth-unsigned": False, "rar-allow-auth-unencrypted": True, "rar-types": {},
        "oauth-par-allowed": False, "oauth-par-duration": 90, "oauth-par-required": False,
        "oauth-par-request_uri-prefix": "urn:ietf:params:oauth:request_uri:",
        "prompt-continue-client-property": "", "restrict-scope-client-property": "",
    }


def check(response, what):
    if response.status_code not in (200, 201, 204):
        sys.exit(f"glewlwyd setup: {what}: HTTP {response.status_code} {response.text[:300]}")


def main():
    base, key_path, public_path, *redirect_uris = sys.argv[1:]
    api = base + "/api"
    user, password = os.environ["GLEWLWYD_USER"], os.environ["GLEWLWYD_PASSWORD"]
    client_id, secret = os.environ["GLEWLWYD_CLIENT_ID"], os.environ["GLEWLWYD_CLIENT_SECRET"]
    admin = requests.Session()
    # Debian's schema ships the administrator admin/password; this instance lives for one run on loopback.
    check(admin.post(api + "/auth/", json={"username": "admin", "password": "password"}), "admin login")
    parameters = plugin_parameters(base + "/api/oidc", open(key_path).read(), open(public_path).read())
    check(admin.post(api + "/mod/plugin/", json={"module": "oidc", "name": "oidc", "display_name": "OIDC",
                                                 "parameters": parameters, "enabled": True}), "OIDC plugin")
    check(admin.post(api + "/user/", json={"username": user, "password": password, "name": "Alice Example",
                                           "email": "alice@example.com", "scope": ["openid"], "enabled": True}),
          "user")
    check(admin.post(api + "/client/", json={
        "client_id": client_id, "name": "relying party", "confidential": True, "password": secret,
        "client_secret": secret, "redirect_uri": redirect_uris, "authorization_type": ["code", "refresh_token"],
        "token_endpoint_auth_method": ["client_secret_basic", "client_secret_post"], "scope": ["openid"], "enabled": True}), "client")
    # GLEWLWYD_EXTRA_USERS=N: also user1..userN (alice1, …) with the same password, for
    # benchmarks where several people sign in at once (Glewlwyd accepts only the last ID token
    # of a user and client as a prompt=none id_token_hint).
    users = [user] + [f"{user}{n}" for n in range(1, int(os.environ.get("GLEWLWYD_EXTRA_USERS", "0")) + 1)]
    for extra in users[1:]:
        check(admin.post(api + "/user/", json={"username": extra, "password": password, "name": "Alice Example",
                                               "email": f"{extra}@example.com", "scope": ["openid"], "enabled": True}),
              "extra user")
    for name in users:
        person = requests.Session()
        check(person.post(api + "/auth/", json={"username": name, "password": password}), "user login")
        check(person.put(f"{api}/auth/grant/{client_id}", json={"scope": "openid"}), "consent")
    discovery = requests.get(base + "/api/oidc/.well-known/openid-configuration")
    check(discovery, "discovery")
    print(f"glewlwyd: OIDC plugin, user {user} and client {client_id} ready at {base}/api/oidc", file=sys.stderr)


if __name__ == "__main__":
    main()
