#!/usr/bin/env node
// An app backend talking to appleid-broker, in Node with nothing but its standard library
// (Node 18+: fetch, node:crypto, node:http). Three commands:
//
//   node broker-example.mjs login   --broker URL --key LOGIN_KEY --identity-token T --authorization-code C --raw-nonce N
//   node broker-example.mjs webhooks --broker URL --key ADMIN_KEY --port 9000 [--exit-after user.created] [--record FILE]
//   node broker-example.mjs feed    --broker URL --key EVENTS_KEY --cursor-file FILE
//
// The nonce: the app makes a random raw nonce on the device, puts its lowercase hex SHA-256
// into the Apple request (ASAuthorizationAppleIDRequest.nonce), and sends the raw one to
// this backend, which passes it as raw_nonce; `hashNonce` below is what the app computes.
// Webhooks follow Standard Webhooks; for production prefer the official `standardwebhooks`
// package (npm, PyPI, Go, Java, Ruby, PHP, Rust, C#: https://github.com/standard-webhooks).
import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { createServer } from "node:http";
import { appendFileSync, readFileSync, writeFileSync, existsSync } from "node:fs";

const [command, ...rest] = process.argv.slice(2);
const options = {};
for (let i = 0; i < rest.length; i += 2) options[rest[i].replace(/^--/, "")] = rest[i + 1];
const broker = options.broker ?? "http://127.0.0.1:8080";

export const newRawNonce = () => randomBytes(32).toString("base64url");
export const hashNonce = (raw) => createHash("sha256").update(raw, "utf8").digest("hex");

async function call(method, path, body) {
  const response = await fetch(broker + path, {
    method,
    headers: { Authorization: `Bearer ${options.key}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  const json = text ? JSON.parse(text) : null;
  if (!response.ok) {
    // RFC 9457 problem: switch on `code`, never on the text.
    const error = new Error(`${json?.code ?? response.status}: ${json?.detail ?? text}`);
    error.problem = json;
    throw error;
  }
  return json;
}

async function login() {
  const body = { identity_token: options["identity-token"], raw_nonce: options["raw-nonce"] };
  if (options["authorization-code"]) body.authorization_code = options["authorization-code"];
  const answer = await call("POST", "/v1/apple/login", body);
  // Start your own session for answer.user_id here; answer.email is verified, unverified_email never is.
  console.log(JSON.stringify(answer));
}

/** Standard Webhooks: HMAC-SHA256 over "id.timestamp.body", base64, in `v1,<sig>` entries. */
export function verify(secret, headers, body, now = Date.now() / 1000) {
  const id = headers["webhook-id"] ?? "";
  const timestamp = headers["webhook-timestamp"] ?? "0";
  if (Math.abs(now - Number(timestamp)) > 300) return false; // replayed or badly delayed
  const expected = createHmac("sha256", secret).update(`${id}.${timestamp}.`).update(body).digest();
  return (headers["webhook-signature"] ?? "").split(" ").some((entry) => {
    const [version, signature] = entry.split(",", 2);
    const given = Buffer.from(signature ?? "", "base64");
    return version === "v1" && given.length === expected.length && timingSafeEqual(given, expected);
  });
}

async function webhooks() {
  const port = Number(options.port ?? 9000);
  const subscription = await call("POST", "/v1/webhook-subscriptions", {
    url: `http://127.0.0.1:${port}/hooks/appleid`, topics: ["*"], description: "examples/node",
  });
  const secret = Buffer.from(subscription.secret.replace(/^whsec_/, ""), "base64");
  const seen = new Set();
  const server = createServer((request, response) => {
    const chunks = [];
    request.on("data", (chunk) => chunks.push(chunk));
    request.on("end", () => {
      const body = Buffer.concat(chunks);
      if (!verify(secret, request.headers, body)) {
        response.writeHead(401).end();
        console.error("refused a delivery with a bad signature or timestamp");
        return;
      }
      response.writeHead(204).end();
      const id = request.headers["webhook-id"];
      if (seen.has(id)) return; // at least once: a retry of something handled
      seen.add(id);
      const event = JSON.parse(body);
      if (options.record) {
        const headers = Object.fromEntries(["webhook-id", "webhook-timestamp", "webhook-signature"].map((h) => [h, request.headers[h]]));
        appendFileSync(options.record, JSON.stringify({ secret: subscription.secret, headers, body: body.toString("utf8") }) + "\n");
      }
      console.log(`${event.timestamp} ${event.type} ${event.id} ${JSON.stringify(event.data)}`);
      if (event.type === options["exit-after"]) server.close();
    });
  });
  server.listen(port, "127.0.0.1", () => {
    console.log(`subscribed ${subscription.id}, listening on ${port}`);
    if (options["ready-file"]) writeFileSync(options["ready-file"], subscription.id);
  });
  server.on("close", () => call("DELETE", `/v1/webhook-subscriptions/${subscription.id}`).catch(() => {}));
}

async function feed() {
  // The cursor is the only state: keep it durably, and after handling a page, not before.
  const file = options["cursor-file"];
  let cursor = file && existsSync(file) ? readFileSync(file, "utf8").trim() : "";
  let count = 0;
  for (;;) {
    const page = await call("GET", `/v1/events?limit=100${cursor ? `&after=${encodeURIComponent(cursor)}` : ""}`);
    for (const event of page.events) {
      console.log(`${event.id} ${event.type} ${event.user_id ?? "-"}`);
      count += 1;
    }
    if (page.next_cursor === cursor || page.events.length === 0) break;
    cursor = page.next_cursor;
    if (file) writeFileSync(file, cursor);
  }
  console.error(`${count} new events`);
}

const commands = { login, webhooks, feed };
if (!commands[command]) {
  console.error("usage: broker-example.mjs login|webhooks|feed --broker URL --key KEY …");
  process.exit(2);
}
commands[command]().catch((error) => {
  console.error(error.message);
  process.exit(1);
});
