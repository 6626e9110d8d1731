#!/usr/bin/env python3
"""The cost of content filters (issue 40), measured against one spoold
binary: QUEUES pull queues subscribed to `order.>`, then EVENTS events
published one after another by one client, three times on fresh spools:
with no filter on any queue; with a filter on every queue (a numeric
range, a prefix and an `anything-but`, on a ~300-byte JSON payload) that
every filter passes (the evaluation's own cost: the same deliveries); and
with filters that half the queues' pass. Prints the `202` latency p50/p99 and the
events per second of each run, and their ratio.

    python3 bench/filters.py path/to/spoold
"""
import http.client
import json
import os
import statistics
import sys
import tempfile
import time

import spoold_proc

BIN = sys.argv[1]
QUEUES = int(os.environ.get("QUEUES", "100"))
EVENTS = int(os.environ.get("EVENTS", "3000"))


def tables(mode):
    out = []
    for i in range(QUEUES):
        out.append(f'[queues.q{i}]\nevents = ["order.>"]\n')
        if mode != "none":
            low = 0 if mode == "all_pass" or i % 2 == 0 else 10_000
            out.append(
                'filter = { payload = { amount = [{ numeric = [">=", %d] }], '
                'region = [{ prefix = "eu-" }], status = [{ "anything-but" = ["void", "draft"] }] } }\n'
                % low)
    return "".join(out)


def run(mode):
    with tempfile.TemporaryDirectory() as d:
        p, port = spoold_proc.start(BIN, d, tables=tables(mode))
        try:
            c = http.client.HTTPConnection("127.0.0.1", port)
            payload = {"amount": 1200, "region": "eu-west-1", "status": "paid",
                       "customer": {"id": "cus_42", "tier": "pro"},
                       "lines": [{"sku": f"sku-{n}", "qty": n} for n in range(8)]}
            took = []
            kept = 0
            started = time.perf_counter()
            for n in range(EVENTS):
                body = json.dumps({"type": "order.created", "payload": dict(payload, n=n)})
                t = time.perf_counter()
                c.request("POST", "/v1/events", body, {"Content-Type": "application/json"})
                r = c.getresponse()
                answer = json.loads(r.read())
                took.append(time.perf_counter() - t)
                assert r.status == 202, answer
                kept += len(answer["deliveries"])
            elapsed = time.perf_counter() - started
        finally:
            p.terminate()
            p.wait()
    took.sort()
    return {
        "p50_ms": statistics.median(took) * 1000,
        "p99_ms": took[int(len(took) * 0.99)] * 1000,
        "events_per_s": EVENTS / elapsed,
        "deliveries_per_event": kept / EVENTS,
    }


results = {mode: run(mode) for mode in ("none", "all_pass", "half_pass")}
for mode, r in results.items():
    ratio = r["events_per_s"] / results["none"]["events_per_s"]
    print(f"RESULT filters mode={mode} queues={QUEUES} events={EVENTS} "
          f"p50_ms={r['p50_ms']:.2f} p99_ms={r['p99_ms']:.2f} "
          f"events_per_s={r['events_per_s']:.0f} deliveries_per_event={r['deliveries_per_event']:.0f} "
          f"vs_none={ratio:.2f}")
