// Send, receive, ack and forward through openapi-fetch, typed by what
// openapi-typescript generates from docs/openapi.json (generate.sh
// compiles this next to schema.d.ts; a type error fails the build); then
// the event catalogue, a paged list, a tenant's key and a portal session.
//
// Environment: SPOOLD_URL, SPOOLD_API_KEY (an operator's), SPOOLD_OPEN_URL
// (a server without keys),
// SPOOLD_TENANT_KEY (tenant cus_smoke's), SPOOLD_SINK (a destination for
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

// A path of several segments and a query, in the header that generated
// clients can send (they percent-encode a path parameter).
const forwarded = await client.POST("/v1/forward/{q}", {
  params: { path: { q: "generated-ts-hooks" }, header: { "Spooler-Forward-Path": "/v1/charges?x=1" } },
  body: "from typescript",
  headers: { "Content-Type": "text/plain" },
  ...raw,
});

// A server without keys takes calls without a token.
const open = createClient<paths>({ baseUrl: env("SPOOLD_OPEN_URL") });
const openMade = await open.PUT("/v1/queues/{q}", {
  params: { path: { q: "open-hooks" } },
  body: { destination: env("SPOOLD_SINK") },
});
check(openMade.response.ok, `PUT open-hooks: ${openMade.response.status}`);
const openForwarded = await open.POST("/v1/forward/{q}", {
  params: { path: { q: "open-hooks" }, header: { "Spooler-Forward-Path": "/v1/charges?x=1" } },
  body: "from typescript, no key",
  headers: { "Content-Type": "text/plain" },
  ...raw,
});
check(openForwarded.response.status === 202, `forward without a key: ${openForwarded.response.status}`);
check(forwarded.response.status === 202 && forwarded.data !== undefined, `forward: ${forwarded.response.status}`);

// The catalogue, paging, a tenant's key and a portal session.
const defined = await client.PUT("/v1/event-types/{name}", {
  params: { path: { name: "smoke.paid" } },
  body: { description: "paid", schema: { type: "object", required: ["amount"] } },
});
check(defined.response.ok, `PUT event type: ${defined.response.status}`);
const bad = await client.POST("/v1/events", { body: { type: "smoke.paid", payload: {} } });
check(bad.response.status === 422 && bad.error?.kind === "schema_mismatch", `publish: ${bad.response.status}`);

const page = await client.GET("/v1/queues", { params: { query: { limit: 1 } } });
check(page.data !== undefined && page.data.queues.length === 1 && typeof page.data.next === "string", "paged list");

const tenant = createClient<paths>({
  baseUrl: env("SPOOLD_URL"),
  headers: { Authorization: `Bearer ${env("SPOOLD_TENANT_KEY")}` },
});
const mine = await tenant.PUT("/v1/queues/{q}", {
  params: { path: { q: "cus_smoke-ts" } },
  body: { destination: env("SPOOLD_SINK") },
});
check(mine.data?.settings.tenant === "cus_smoke", `tenant PUT: ${mine.response.status}`);
const listed = await tenant.GET("/v1/queues");
const names = (listed.data?.queues ?? []).map((q) => q.name).join(",");
check(names === "cus_smoke-ts,cus_smoke-ts.failed", `tenant list: ${names}`);

const link = await client.POST("/v1/portal/sessions", {
  body: { tenant: "cus_smoke", ttlSeconds: 600, capabilities: ["read"] },
});
check(link.data !== undefined && link.data.url.includes("/portal/#token="), `session: ${link.response.status}`);
const session = createClient<paths>({
  baseUrl: env("SPOOLD_URL"),
  headers: { Authorization: `Bearer ${link.data.token}` },
});
const who = await session.GET("/v1/portal/session");
check(who.data?.tenant === "cus_smoke" && who.data.may.join() === "read", "who am I");

console.log("ok", id, forwarded.data.id);
