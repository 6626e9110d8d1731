// spoold's lease protocol and an idempotent forward, with Node's fetch only.
const BASE = (process.env.SPOOLD_URL ?? "http://127.0.0.1:8787").replace(/\/$/, "");
const KEY = process.env.SPOOLD_API_KEY;

async function call(method, path, body, headers = {}) {
  const h = { ...headers };
  if (KEY) h["Spooler-Api-Key"] = KEY;
  if (body !== undefined && typeof body !== "string") {
    body = JSON.stringify(body);
    h["Content-Type"] ??= "application/json";
  }
  const r = await fetch(BASE + path, { method, body, headers: h });
  if (r.status >= 400) {
    throw new Error(`${method} ${path}: ${r.status} ${await r.text()}`);
  }
  return r;
}

function check(condition, what) {
  if (!condition) throw new Error(`expected ${what}`);
}

await call("PUT", "/v1/queues/examples", { leaseTimeoutSeconds: 30, maxRetries: 5 });
await call("PUT", "/v1/queues/examples-hooks", {
  destination: "http://127.0.0.1:9/hooks",
  dedupWindowSeconds: 600,
});

let r = await call("POST", "/v1/queues/examples/messages", '{"order": 42}', {
  "Content-Type": "application/json",
});
check(r.status === 201, "201 after the fsync");
const sent = (await r.json()).id;

// Receive: long-poll up to 5 s; the payload is the body, the lease the headers.
r = await call("POST", "/v1/queues/examples/receive?wait=5");
check(r.headers.get("spooler-message-id") === sent, "the message sent");
check((await r.json()).order === 42, "the payload");
let token = r.headers.get("spooler-lease-token");

// The work failed: give it back now (its retry count rises).
r = await call("POST", `/v1/queues/examples/leases/${token}/nack?delay=0`);
check(r.status === 204, "204 for the nack");

r = await call("POST", "/v1/queues/examples/receive?wait=5");
check(r.headers.get("spooler-retry-count") === "1", "retry count 1");
token = r.headers.get("spooler-lease-token");
await r.arrayBuffer();

// Long work: extend the lease, then ack (204 once the removal is durable).
r = await call("POST", `/v1/queues/examples/leases/${token}/renew`);
check("leaseExpiresAt" in (await r.json()), "a new expiry");
r = await call("POST", `/v1/queues/examples/leases/${token}/ack`);
check(r.status === 204, "204 for the ack");

// Forward the same request twice with one idempotency key: stored once
// (202), then answered from the dedup window (200, the same delivery id).
const ids = [];
for (const expected of [202, 200]) {
  r = await call("POST", "/v1/forward/examples-hooks/invoices/7?notify=1", '{"amount": 10}', {
    "Content-Type": "application/json",
    "Spooler-Idempotency-Key": "invoice-7",
  });
  check(r.status === expected, `${expected} for the forward`);
  ids.push(r.headers.get("spooler-delivery-id"));
}
check(r.headers.get("spooler-deduplicated") === "true", "the duplicate flagged");
check(ids[0] === ids[1], "one delivery id");
console.log("ok", sent, ids[0]);
