"""spoold's lease protocol and an idempotent forward, with urllib only."""
import json
import os
import urllib.error
import urllib.request

BASE = os.environ.get("SPOOLD_URL", "http://127.0.0.1:8787").rstrip("/")
KEY = os.environ.get("SPOOLD_API_KEY")


def call(method, path, body=None, headers=None):
    """Returns (status, headers, body bytes); a 4xx/5xx raises with spoold's
    {"kind", "message"}."""
    h = dict(headers or {})
    if KEY:
        h["Spooler-Api-Key"] = KEY
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    if isinstance(body, dict):
        h.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(BASE + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {path}: {e.code} {e.read().decode()}")


call("PUT", "/v1/queues/examples", {"leaseTimeoutSeconds": 30, "maxRetries": 5})
call("PUT", "/v1/queues/examples-hooks",
     {"destination": "http://127.0.0.1:9/hooks", "dedupWindowSeconds": 600})

status, headers, body = call("POST", "/v1/queues/examples/messages",
                             b'{"order": 42}', {"Content-Type": "application/json"})
assert status == 201, status
sent = json.loads(body)["id"]

# Receive: long-poll up to 5 s; the payload is the body, the lease the headers.
status, headers, body = call("POST", "/v1/queues/examples/receive?wait=5")
assert status == 200 and headers["Spooler-Message-Id"] == sent
assert json.loads(body) == {"order": 42}
token = headers["Spooler-Lease-Token"]

# The work failed: give it back now (its retry count rises).
status, _, _ = call("POST", f"/v1/queues/examples/leases/{token}/nack?delay=0")
assert status == 204

status, headers, body = call("POST", "/v1/queues/examples/receive?wait=5")
assert headers["Spooler-Retry-Count"] == "1", headers["Spooler-Retry-Count"]
token = headers["Spooler-Lease-Token"]

# Long work: extend the lease, then ack (204 once the removal is durable).
status, _, body = call("POST", f"/v1/queues/examples/leases/{token}/renew")
assert "leaseExpiresAt" in json.loads(body)
status, _, _ = call("POST", f"/v1/queues/examples/leases/{token}/ack")
assert status == 204

# Forward the same request twice with one idempotency key: stored once
# (202), then answered from the dedup window (200, the same delivery id).
ids = []
for expected in (202, 200):
    status, headers, _ = call("POST", "/v1/forward/examples-hooks/invoices/7?notify=1",
                              b'{"amount": 10}',
                              {"Content-Type": "application/json",
                               "Spooler-Idempotency-Key": "invoice-7"})
    assert status == expected, status
    ids.append(headers["Spooler-Delivery-Id"])
assert headers["Spooler-Deduplicated"] == "true"
assert ids[0] == ids[1], ids
print("ok", sent, ids[0])
