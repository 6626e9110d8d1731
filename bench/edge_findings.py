#!/usr/bin/env python3
"""The three load findings of issue 26, measured against one spoold binary.

    python3 bench/edge_findings.py path/to/spoold

1. peek: 4 parallel `GET …/messages?limit=1000` over BODIES bodies of
   1 MiB NUL bytes: the server's peak RSS (VmHWM) and the largest answer.
2. slots: 4 200 idle connections kept open (what the server closes is
   opened again), and 20 `/healthz` probes (2 s each): how many answered.
3. scrape: QUEUES queues, one `/metrics` scrape: its size and time.

Run the old and the new binary one after the other on the same machine;
docs/reliability.md keeps the figures.
"""
import http.client
import os
import resource
import socket
import sys
import tempfile
import threading
import time

import spoold_proc

BIN = sys.argv[1]
BODIES = int(os.environ.get("BODIES", "200"))
QUEUES = int(os.environ.get("QUEUES", "23000"))


def start(dir, server="", tables=""):
    return spoold_proc.start(BIN, dir, server=server, tables=tables)


def hwm(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) // 1024


def peek():
    with tempfile.TemporaryDirectory() as d:
        p, port = start(d, 'max_body_bytes = "2MiB"', "[queues.q]\n")
        body = b"\0" * (1 << 20)
        c = http.client.HTTPConnection("127.0.0.1", port)
        for _ in range(BODIES):
            c.request("POST", "/v1/queues/q/messages", body)
            r = c.getresponse()
            r.read()
            assert r.status == 201, r.status
        before = hwm(p.pid)
        sizes = []

        def one():
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            c.request("GET", "/v1/queues/q/messages?limit=1000")
            sizes.append(len(c.getresponse().read()))
        threads = [threading.Thread(target=one) for _ in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(f"peek: {BODIES} x 1 MiB NUL, 4 parallel: peak RSS {before} -> "
              f"{hwm(p.pid)} MiB, largest answer {max(sizes) / 2**20:.1f} MiB")
        p.kill()


def slots():
    """An attacker keeps 4 200 idle connections open (reopening what the
    server closes) while 20 probes, one a second, each wait 2 s."""
    import select
    with tempfile.TemporaryDirectory() as d:
        p, port = start(d)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4200)]
        stop = threading.Event()

        def keep_up():
            while not stop.is_set():
                poller = select.poll()
                by_fd = {s.fileno(): s for s in idle}
                for fd in by_fd:
                    poller.register(fd, select.POLLIN | select.POLLHUP)
                for fd, _ in poller.poll(200):
                    s = by_fd[fd]
                    idle.remove(s)
                    s.close()
                    try:
                        idle.append(socket.create_connection(("127.0.0.1", port), timeout=1))
                    except OSError:
                        pass
        keeper = threading.Thread(target=keep_up)
        keeper.start()
        time.sleep(0.5)
        answered = 0
        for _ in range(20):
            started = time.time()
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/healthz")
                answered += c.getresponse().status == 200
            except OSError:
                pass
            time.sleep(max(0, 1 - (time.time() - started)))
        stop.set()
        keeper.join()
        print(f"slots: 4200 idle connections kept open: {answered} of 20 probes answered")
        [s.close() for s in idle]
        p.kill()


def scrape():
    with tempfile.TemporaryDirectory() as d:
        tables = "".join(f"[queues.q{i:05}]\n" for i in range(QUEUES))
        t0 = time.time()
        p, port = start(d, "", tables)
        print(f"scrape: {QUEUES} queues ready in {time.time() - t0:.1f} s")
        for _ in range(2):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            t = time.time()
            c.request("GET", "/metrics")
            n = len(c.getresponse().read())
            took = time.time() - t
        print(f"scrape: {QUEUES} queues: one scrape {n / 2**20:.1f} MiB in {took:.2f} s, "
              f"peak RSS {hwm(p.pid)} MiB")
        p.kill()


resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
for what in sys.argv[2:] or ["peek", "slots", "scrape"]:
    globals()[what]()
