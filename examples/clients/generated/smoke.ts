// Send, receive, ack and forward through openapi-fetch, typed by what
// openapi-typescript generates from docs/openapi.json (generate.sh
// compiles this next to schema.d.ts; a type error fails the build).
//
// Environment: SPOOLD_URL, SPOOLD_API_KEY, SPOOLD_SINK (a destination for
// the push queue). Prints "ok <message id> <forwarded id>".
import createClient from "openapi-fetch";
import type { paths } from "./schema.js";

const env = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};

function check(ok: boolean, what: string): asserts ok {
  if (!ok) throw new Error(what);
}

const client = createClient<paths>({
  baseUrl: env("SPOOLD_URL"),
  headers: { "Spooler-Api-Key": env("SPOOLD_API_KEY") },
});
// Payloads go as they are: openapi-fetch would JSON-encode them.
const raw = { bodySerializer: (body: unknown) => body as string };

for (const [q, body] of [
  ["generated-ts", { maxRetries: 3 }],
  ["generated-ts-hooks", { destination: env("SPOOLD_SINK") }],
] as const) {
  const made = await client.PUT("/v1/queues/{q}", { params: { path: { q } }, body });
  check(made.response.ok, `PUT ${q}: ${made.response.status}`);
}

const payload = '{"order": 42, "from": "typescript"}';
const sent = await client.POST("/v1/queues/{q}/messages", {
  params: { path: { q: "generated-ts" } },
  body: payload,
  headers: { "Content-Type": "application/json" },
  ...raw,
});
check(sent.response.status === 201 && sent.data !== undefined, `send: ${sent.response.status}`);
const id: string = sent.data.id;

const got = await client.POST("/v1/queues/{q}/receive", {
  params: { path: { q: "generated-ts" } },
  parseAs: "text",
});
check(got.response.status === 200, `receive: ${got.response.status}`);
check(got.data === payload, `receive: ${String(got.data)}`);
check(got.response.headers.get("spooler-message-id") === id, "receive: another message");
const token = got.response.headers.get("spooler-lease-token");
check(token !== null, "receive: no lease token");

const acked = await client.POST("/v1/queues/{q}/leases/{token}/ack", {
  params: { path: { q: "generated-ts", token } },
});
check(acked.response.status === 204, `ack: ${acked.response.status}`);

const forwarded = await client.POST("/v1/forward/{q}/{path}", {
  params: { path: { q: "generated-ts-hooks", path: "charges" } },
  body: "from typescript",
  headers: { "Content-Type": "text/plain" },
  ...raw,
});
check(forwarded.response.status === 202 && forwarded.data !== undefined, `forward: ${forwarded.response.status}`);
console.log("ok", id, forwarded.data.id);
