#!/usr/bin/env python3
"""Issue 38's search and fan-out bounds, measured against one spoold binary
(bench/run.sh's `search` section runs it and keeps its RESULT lines).

    python3 bench/search.py path/to/spoold

1. search: BODIES JSON bodies of 1 MiB in a pull queue; SEARCHERS threads
   each ask, for SECONDS seconds, the worst pages there are (alternately a
   1 KiB `contains` that almost matches everywhere, and a `match` that must
   parse every body), while a probe asks `/healthz` every 20 ms. Before
   them, the same probe alone. Prints /healthz p50/p99/max idle and under
   the searches, pages answered, pages refused with 429, page p50/p99.
2. fanout: QUEUES pull queues subscribed to `t.>`, EVENTS small events to
   all of them: the process's RSS before and after, per delivery, beside
   the memory account (`spoold_memory_accounted_bytes`).
"""
import http.client
import json
import os
import sys
import tempfile
import threading
import time

import spoold_proc

BIN = sys.argv[1]
BODIES = int(os.environ.get("BODIES", "200"))
SEARCHERS = int(os.environ.get("SEARCHERS", "8"))
SECONDS = float(os.environ.get("SECONDS_EACH", "15"))
QUEUES = int(os.environ.get("QUEUES", "10000"))
EVENTS = int(os.environ.get("EVENTS", "300"))




def start(dir, server="", spool="", tables=""):
    return spoold_proc.start(BIN, dir, server, spool, tables)


def call(port, method, path, body=None, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, r.headers, data


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    return 0


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def probe(port, until, out):
    """`/healthz` every 20 ms until `until`, each one's time in ms."""
    while time.time() < until:
        t = time.perf_counter()
        call(port, "GET", "/healthz", timeout=60)
        out.append((time.perf_counter() - t) * 1000)
        time.sleep(0.02)


def body(i):
    """About 1 MiB of JSON: an array of small objects, the last one naming
    the body, so that a `match` parses all of it."""
    item = '{"sku":"aaaaaaaaaaaaaaaa","qty":1},'
    n = (1 << 20) // len(item)
    return ('{"items":[' + item * n + f'{{"sku":"last","qty":{i}}}]}}').encode()


def search():
    dir = tempfile.mkdtemp()
    p, port = start(dir, server='max_body_bytes = "2MiB"', spool='max_bytes = "4GiB"',
                    tables='[queues.bench]\n')
    try:
        for i in range(BODIES):
            status, _, answer = call(port, "POST", "/v1/queues/bench/messages", body(i))
            assert status == 201, answer
        idle = []
        probe(port, time.time() + 3, idle)
        # A needle that almost matches at every byte of every body.
        needle = "a" * 1023 + "b"
        terms = [f"contains={needle}", "match=items[0].sku=nowhere"]
        pages, refused, times = [0], [0], []
        lock = threading.Lock()
        until = time.time() + SECONDS

        def searcher(k):
            n = k
            while time.time() < until:
                t = time.perf_counter()
                status, _, _ = call(port, "GET",
                                    f"/v1/queues/bench/messages?limit=1000&{terms[n % 2]}")
                took = (time.perf_counter() - t) * 1000
                n += 1
                with lock:
                    if status == 429:
                        refused[0] += 1
                    else:
                        assert status == 200, status
                        pages[0] += 1
                        times.append(took)
                if status == 429:
                    time.sleep(0.05)

        threads = [threading.Thread(target=searcher, args=(k,)) for k in range(SEARCHERS)]
        busy = []
        prober = threading.Thread(target=probe, args=(port, until, busy))
        for t in threads + [prober]:
            t.start()
        for t in threads + [prober]:
            t.join()
        print(f"RESULT search bodies={BODIES} searchers={SEARCHERS} "
              f"healthz_idle_p50_ms={pct(idle, 0.5):.1f} healthz_idle_p99_ms={pct(idle, 0.99):.1f} "
              f"healthz_p50_ms={pct(busy, 0.5):.1f} healthz_p99_ms={pct(busy, 0.99):.1f} "
              f"healthz_max_ms={max(busy):.1f} probes={len(busy)} "
              f"pages={pages[0]} refused={refused[0]} "
              f"page_p50_ms={pct(times, 0.5):.0f} page_p99_ms={pct(times, 0.99):.0f}", flush=True)
    finally:
        p.kill()
        p.wait()


def fanout():
    dir = tempfile.mkdtemp()
    p, port = start(dir, spool='max_bytes = "8GiB"', tables="[events]\nmax_subscribers = 100000\n")
    try:
        for i in range(QUEUES):
            status, _, answer = call(port, "PUT", f"/v1/queues/q{i}", json.dumps({"events": ["t.>"]}))
            assert status in (200, 201), answer
        time.sleep(1)
        before = rss(p.pid)
        for i in range(EVENTS):
            status, _, answer = call(port, "POST", "/v1/events",
                                     json.dumps({"type": "t.x", "payload": {"n": i}}))
            assert status == 202, answer
        time.sleep(1)
        after = rss(p.pid)
        _, _, metrics = call(port, "GET", "/metrics")
        accounted = next(float(line.split()[-1]) for line in metrics.decode().splitlines()
                         if line.startswith("spoold_memory_accounted_bytes"))
        deliveries = QUEUES * EVENTS
        print(f"RESULT fanout queues={QUEUES} events={EVENTS} deliveries={deliveries} "
              f"rss_before_mib={before >> 20} rss_after_mib={after >> 20} "
              f"rss_bytes_per_delivery={(after - before) / deliveries:.1f} "
              f"accounted_mib={accounted / 2**20:.1f}", flush=True)
    finally:
        p.kill()
        p.wait()


if __name__ == "__main__":
    search()
    fanout()
