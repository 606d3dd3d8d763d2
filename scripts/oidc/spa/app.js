// A single-page relying party, as such apps sign in with OpenID Connect (OAuth 2.0 for
// Browser-Based Apps): a public client, the authorization code flow with PKCE S256, the code
// exchanged by fetch() across origins (the provider's CORS), userinfo with a Bearer header
// (a preflighted request), and silent renewal with prompt=none, which only works while the
// person's session at the provider lives. The renewal is a top-level navigation that comes
// straight back: in a hidden iframe of another site the provider's cookie is a third-party
// cookie, which browsers now withhold (Chromium does by default). No library: what a browser gives.
"use strict";

const show = (id, text) => { document.getElementById(id).textContent = text; };
const b64url = (bytes) => btoa(String.fromCharCode(...new Uint8Array(bytes))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
const random = () => b64url(crypto.getRandomValues(new Uint8Array(32)));
const claims = (jwt) => JSON.parse(atob(jwt.split(".")[1].replace(/-/g, "+").replace(/_/g, "/")));

async function settings() {
  const config = await (await fetch("/config.json")).json();
  const discovery = await (await fetch(config.issuer + "/.well-known/openid-configuration")).json();
  return { ...config, discovery };
}

async function authorizeURL(s, redirectPath, extra, purpose) {
  const verifier = random(), state = random(), nonce = random();
  sessionStorage.setItem("pkce:" + state, JSON.stringify({ verifier, nonce, redirectPath, purpose }));
  const challenge = b64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
  const query = new URLSearchParams({
    response_type: "code", client_id: s.client_id, redirect_uri: location.origin + redirectPath,
    scope: "openid email", state, nonce, code_challenge: challenge, code_challenge_method: "S256", ...extra,
  });
  return s.discovery.authorization_endpoint + "?" + query;
}

// The callback's query: checks state and iss, exchanges the code with the verifier.
async function redeem(s, search) {
  const answer = new URLSearchParams(search);
  const state = answer.get("state");
  const pending = JSON.parse(sessionStorage.getItem("pkce:" + state) || "null");
  sessionStorage.removeItem("pkce:" + state);
  if (!pending) throw new Error("unknown state");
  if (answer.get("iss") !== s.discovery.issuer) throw new Error("iss is not the provider's");
  if (answer.get("error")) return { error: answer.get("error"), purpose: pending.purpose };
  const response = await fetch(s.discovery.token_endpoint, {
    method: "POST", headers: { "Content-Type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({
      grant_type: "authorization_code", code: answer.get("code"), redirect_uri: location.origin + pending.redirectPath,
      client_id: s.client_id, code_verifier: pending.verifier,
    }),
  });
  const tokens = await response.json();
  if (!response.ok) throw new Error("token endpoint: " + JSON.stringify(tokens));
  const idToken = claims(tokens.id_token);
  if (idToken.nonce !== pending.nonce) throw new Error("nonce mismatch");
  if (idToken.aud !== s.client_id || idToken.iss !== s.discovery.issuer) throw new Error("aud or iss mismatch");
  return { tokens, idToken, purpose: pending.purpose };
}

async function userinfo(s, accessToken) {
  const response = await fetch(s.discovery.userinfo_endpoint, { headers: { Authorization: "Bearer " + accessToken } });
  if (!response.ok) throw new Error("userinfo: " + response.status);
  return response.json();
}

async function signIn() {
  location.assign(await authorizeURL(await settings(), "/callback.html", {}, "sign-in"));
}

// Silent renewal: prompt=none; the provider answers at once, without a page, from its session.
async function renew() {
  location.assign(await authorizeURL(await settings(), "/callback.html", { prompt: "none" }, "renew"));
}

async function main() {
  document.getElementById("sign-in").addEventListener("click", () => signIn().catch((e) => show("error", e.message)));
  document.getElementById("renew").addEventListener("click", () => renew().catch((e) => show("error", e.message)));
  const signedIn = JSON.parse(sessionStorage.getItem("signed-in") || "null");
  if (signedIn) {
    show("status", "signed in");
    for (const [key, value] of Object.entries(signedIn)) show(key, value);
  }
  const renewed = JSON.parse(sessionStorage.getItem("renewed") || "null");
  if (renewed) for (const [key, value] of Object.entries(renewed)) show(key, value);
}

async function callback() {
  try {
    const s = await settings();
    const result = await redeem(s, location.search);
    if (result.purpose === "renew") {
      const renewed = { "renew-status": result.error || "renewed" };
      if (!result.error) {
        const info = await userinfo(s, result.tokens.access_token);
        Object.assign(renewed, {
          "renew-sub": result.idToken.sub, "renew-auth-time": String(result.idToken.auth_time),
          "renew-sid": result.idToken.sid, "renew-userinfo-sub": info.sub,
        });
      }
      sessionStorage.setItem("renewed", JSON.stringify(renewed));
    } else {
      if (result.error) throw new Error(result.error);
      const info = await userinfo(s, result.tokens.access_token);
      sessionStorage.setItem("signed-in", JSON.stringify({
        sub: result.idToken.sub, "auth-time": String(result.idToken.auth_time), sid: result.idToken.sid, "userinfo-sub": info.sub,
      }));
    }
    location.replace("/");
  } catch (e) {
    show("error", e.message);
  }
}
