#!/usr/bin/env python3
"""Turns bench/results.txt (the result lines of bench/run.sh, each section
from the last run that measured it) into the tables of docs/performance.md,
between the bench:run.sh markers, and prints them.

A section that was never measured shows "not measured"; a row of an older
run says its date. Targets are ratios to the HTTP floor (GET /healthz at
64 connections) or to another figure, never absolute rates: this machine's
speed moves by half from one day to the next.

Usage: report.py RESULTS_FILE
"""
import os
import platform
import re
import subprocess
import sys

BEGIN = "<!-- bench:run.sh:begin -->"
END = "<!-- bench:run.sh:end -->"
DOC = "docs/performance.md"

# Targets against the floor: the ratios of the absolute targets they
# replace (pull 20 000/s, push 15 000/s, replay 1 M records/s) to the floor
# of the run that met them (76.5 k requests/s), unrounded.
FLOOR_WHEN_SET = 76_500
PULL_PER_FLOOR = 20_000 / FLOOR_WHEN_SET
# Issue 43's push targets, against the bare relay of the same trial
# (examples/relay.rs), as medians of the trials' ratios: delivered/s at
# least 0.75 × the relay's, CPU per message at most 1.5 × the relay's; and
# issue 29's p99 from forward to arrival ≤ 10 ms at half the rate.
PUSH_PER_RELAY = 0.75
PUSH_CPU_PER_RELAY_MAX = 1.5
PUSH_P99_MS_MAX = 10
# Issue 43: the sends' p99 at 64 connections at most Redis's in at least
# 2 of 3 trials of one run (section tail), at no less than its rate.
TAIL_TRIALS_NEEDED = 2
REPLAY_PER_FLOOR = 1_000_000 / FLOOR_WHEN_SET
RSS_BYTES_PER_MESSAGE_MAX = 200


def parse(path):
    rows = []
    for line in open(path):
        words = line.split()
        if not words:
            continue
        row = {"what": words[0]}
        for w in words[1:]:
            if "=" in w:
                k, v = w.split("=", 1)
                row[k] = v
        rows.append(row)
    return rows


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def median(rows, key):
    """The row with the median `key` (the lower middle of an even count)."""
    ranked = sorted(rows, key=lambda r: num(r.get(key)))
    return ranked[(len(ranked) - 1) // 2] if ranked else {}


def trials(rows, key):
    """Every trial's `key`, in the order run: "a, b, c"."""
    return ", ".join(str(r.get(key)) for r in rows)


def pair_ratios(pushes, relays):
    """spoold's push against the relay of the same trial: delivered/s and
    CPU per message, each trial's ratio in the order run."""
    relay_of = {r.get("trial"): r for r in relays}
    pairs = [(p, relay_of[p.get("trial")]) for p in pushes if p.get("trial") in relay_of]
    if not pairs:
        return "not measured"
    rate = ", ".join(f"{ratio(p.get('push_delivered_per_s'), r.get('push_delivered_per_s')):.2f}" for p, r in pairs)
    cpu = ", ".join(f"{ratio(p.get('push_cpu_us_per_msg'), r.get('push_cpu_us_per_msg')):.2f}" for p, r in pairs)
    return f"{rate} ×; {cpu} ×"


def median_ratio(pushes, relays, key):
    """The median over the trials of push ÷ the relay of the same trial."""
    relay_of = {r.get("trial"): r for r in relays}
    rs = sorted(ratio(p.get(key), relay_of[p.get("trial")].get(key))
                for p in pushes if p.get("trial") in relay_of)
    return rs[(len(rs) - 1) // 2] if rs else float("nan")


def tail_pairs(rows):
    """Section tail's trials: (trial, spoold's row, Redis's row), in order."""
    trials_of = {}
    for r in rows:
        trials_of.setdefault(r.get("trial"), {})[r.get("system")] = r
    return [(t, v["spoold"], v["redis"]) for t, v in sorted(trials_of.items(), key=lambda kv: num(kv[0]))
            if "spoold" in v and "redis" in v]


def tail_met(sp, rd):
    """One trial meets the tail target: p99 ≤ Redis's at ≥ its rate."""
    return ratio(sp.get("sends_per_s"), rd.get("sends_per_s")) >= 1.0 and ratio(sp.get("p99_us"), rd.get("p99_us")) <= 1.0


def tail_section(out, rows):
    """Section tail: spoold's durable sends and Redis LPUSH at 64
    connections, trial by trial, and the tail target's verdict."""
    pairs = tail_pairs(rows)
    if not pairs:
        return
    out.append("### The sends' tail beside Redis (trials interleaved)")
    out.append("")
    out.append("1 KiB durable sends at 64 connections (wrk, `bench/post.lua`) and Redis LPUSH with "
               "`appendfsync always` (redis-benchmark), one after the other in each trial. Target: "
               f"spoold's p99 ≤ 1.0 × Redis's in at least {TAIL_TRIALS_NEEDED} of 3 trials, at ≥ 1.0 × its rate.")
    out.append("")
    out.append("| trial | spoold sends/s | p50 ms | p99 ms | Redis LPUSH/s | p50 ms | p99 ms | rate ÷ Redis | p99 ÷ Redis | |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    met = 0
    for t, sp, rd in pairs:
        rate = ratio(sp.get("sends_per_s"), rd.get("sends_per_s"))
        p99 = ratio(sp.get("p99_us"), rd.get("p99_us"))
        ok = tail_met(sp, rd)
        met += ok
        out.append(f"| {t} | {show(sp.get('sends_per_s'))} | {ms(sp.get('p50_us'))} | {ms(sp.get('p99_us'))} "
                   f"| {show(rd.get('sends_per_s'))} | {ms(rd.get('p50_us'))} | {ms(rd.get('p99_us'))} "
                   f"| {fmt_ratio(rate)} | {fmt_ratio(p99)} | {'met' if ok else '**not met**'} |")
    verdict = "met" if met >= TAIL_TRIALS_NEEDED else "**not met**"
    out.append("")
    out.append(f"Trials meeting both: {met} of {len(pairs)} ({verdict}).")
    out.append("")


def machine():
    cpu = "unknown CPU"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = 0
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal"):
            mem = int(line.split()[1]) // (1024 * 1024)
    df = subprocess.run(["df", "-T", "."], capture_output=True, text=True).stdout.splitlines()
    fs = df[-1].split()[1] if df else "?"
    return f"{os.cpu_count()} vCPU {cpu}, {mem} GiB, Linux {platform.release()}, {fs}"


def ms(us):
    v = num(us)
    return "–" if v != v else f"{v / 1000:.2f}"


def show(v):
    return "not measured" if v in (None, "") else str(v)


def ratio(a, b):
    r = num(a) / num(b) if num(b) else float("nan")
    return r


def fmt_ratio(r):
    return "–" if r != r else f"{r:.2f} ×"


def section(out, title, rows, only, intro, head, rule):
    """Opens a section of the report: its title, then "not measured" when
    it has no rows (False), else its introduction and its table's head."""
    out.append(f"### {title}")
    out.append("")
    if not rows:
        out.append(f"Not measured (`ONLY={only} bench/run.sh`).")
        return False
    out.append(intro)
    out.append("")
    out.append(head)
    out.append(rule)
    return True


SVIX_FIGURES = (("events_per_s", "events/s", True), ("deliveries_per_s", "deliveries/s", True),
                ("cpu_us_per_delivery", "CPU µs per delivery", False), ("pss_mib", "PSS MiB", False),
                ("disk_bytes_per_delivery", "bytes written per delivery", False))


def svix_section(out, rows):
    """spoold beside Svix's server at each number of endpoints: each at its
    most, each at half of it for latency, and spoold ÷ Svix for every
    figure, with issue 43's targets."""
    if not section(out, "Side by side: Svix's server (webhook fan-out)", rows, "svix",
                   "`examples/fanout.rs` for both: one event type, N endpoints that are paths of one local "
                   "destination (its own thread in the load generator), events of about 1 KiB of JSON from 16 "
                   "connections. spoold: N push queues subscribed to the type, history kept 24 h / 1 MiB; "
                   "Svix (`svix-server`, built as below): one application with N endpoints, PostgreSQL 15 "
                   "(fsync on) and Redis (`appendonly yes`, everysec) as its queue. Each run on a fresh spool "
                   "or database. Figures from the first publish to the last first arrival of every "
                   "(endpoint, event); CPU: spoold's process, or svix-server + PostgreSQL (every backend) + "
                   "Redis; PSS: the highest sum sampled every 0.5 s; bytes written: the block device's, "
                   "file-system journal and WAL included. Latency at half of each one's own most "
                   "deliveries/s (open loop, from each event's appointed publish time). At 10 000 endpoints "
                   "Svix runs one worker task at a time (`SVIX_WORKER_MAX_TASKS=1`): a message's task sends "
                   "to every endpoint at once on connections of its own, and its default of 500 went past "
                   "the 20 000 descriptors this machine allows a process.",
                   "| endpoints × events | system | events/s | deliveries/s | CPU µs per delivery | PSS MiB "
                   "| bytes written per delivery | at half: p50 ms | p99 ms |",
                   "|---|---|---:|---:|---:|---:|---:|---:|---:|"):
        return
    sizes = sorted({(int(num(r.get("endpoints"))), int(num(r.get("events")))) for r in rows})
    cpu_by_n, ratios = {}, []
    for n, e in sizes:
        got = {}
        for system in ("spoold", "svix"):
            rs = [r for r in rows if r.get("system") == system and r.get("endpoints") == str(n)]
            most = median([r for r in rs if r.get("load") == "max"], "deliveries_per_s")
            half = median([r for r in rs if r.get("load") == "half"], "p99_ms")
            if not most:
                continue
            if most.get("failed"):
                out.append(f"| {n} × {e} | Svix {most.get('svix', '')} | did not finish: its deliveries stalled "
                           "with ~20 000 connections open to the destination and none left for PostgreSQL "
                           "(\"Too many open files\"; this machine allows a process 20 000) | | | | | | |")
                continue
            got[system] = (most, half)
            name = "spoold" if system == "spoold" else f"Svix {most.get('svix', '')}, PostgreSQL {most.get('postgres', '')}"
            if most.get("svix_worker_max_tasks", "500") != "500":
                name += f" ({most['svix_worker_max_tasks']} worker task at a time)"
            figures = " | ".join(show(most.get(k)) for k, _, _ in SVIX_FIGURES)
            out.append(f"| {n} × {e} | {name} | {figures} | {show(half.get('p50_ms'))} "
                       f"| {show(half.get('p99_ms'))} (at {show(half.get('rate'))} events/s) |")
        if len(got) == 2:
            (sm, sh), (vm, vh) = got["spoold"], got["svix"]
            each = " | ".join(fmt_ratio(ratio(sm.get(k), vm.get(k))) for k, _, _ in SVIX_FIGURES)
            p50, p99 = ratio(sh.get("p50_ms"), vh.get("p50_ms")), ratio(sh.get("p99_ms"), vh.get("p99_ms"))
            out.append(f"| {n} × {e} | **spoold ÷ Svix** | {each} | {fmt_ratio(p50)} | {fmt_ratio(p99)} |")
            ratios.append((n, ratio(sm.get("deliveries_per_s"), vm.get("deliveries_per_s")),
                           ratio(sm.get("cpu_us_per_delivery"), vm.get("cpu_us_per_delivery")),
                           ratio(sm.get("pss_mib"), vm.get("pss_mib")), p99))
        if "spoold" in got:
            cpu_by_n[n] = num(got["spoold"][0].get("cpu_us_per_delivery"))
    out.append("")
    out.append("Against issue 43's targets:")
    out.append("")
    out.append("| endpoints | deliveries/s ≥ 5 × Svix | CPU per delivery ≤ 1/5 | memory ≤ 1/5 | p99 at half ≤ 1/10 |")
    out.append("|---:|---|---|---|---|")
    mark = lambda r, ok: f"{fmt_ratio(r)} {'met' if ok else '**not met**'}"
    for n, d, c, m, p in ratios:
        out.append(f"| {n} | {mark(d, d >= 5)} | {mark(c, c <= 0.2)} | {mark(m, m <= 0.2)} | {mark(p, p <= 0.1)} |")
    if cpu_by_n:
        lo, hi = min(cpu_by_n), max(cpu_by_n)
        r = cpu_by_n[hi] / cpu_by_n[lo]
        out.append("")
        out.append(f"spoold's CPU per delivery at {hi} endpoints ÷ at {lo}: {fmt_ratio(r)} (target ≤ 1.5 ×: "
                   f"{'met' if r <= 1.5 else '**not met**'}).")
    out.append("")


def report(rows):
    out = []
    by = {}
    for r in rows:
        by.setdefault(r["what"], []).append(r)
    dates = {w: sorted({r.get("date", "?") for r in rs}) for w, rs in by.items()}
    out.append(f"Machine: {machine()}. Sections and the day each was measured: "
               + ", ".join(f"{w} {'/'.join(d)}" for w, d in sorted(dates.items())) + ".")
    out.append("")

    floor = (by.get("floor") or [{}])[-1]
    floor_rps = num(floor.get("sends_per_s"))
    out.append(f"**The floor** (GET /healthz, wrk, 64 connections, no body, no journal): "
               f"{show(floor.get('sends_per_s'))} requests/s, p50 {ms(floor.get('p50_us'))} ms, "
               f"p99 {ms(floor.get('p99_us'))} ms.")
    out.append("")

    out.append("### Sends over HTTP: spoold (wrk) and Redis LPUSH with `appendfsync always` (redis-benchmark)")
    out.append("")
    out.append("| body | conns | spoold fsync on: sends/s | p50 ms | p99 ms | fsync off: sends/s | p50 ms | p99 ms "
               "| Redis: LPUSH/s | p50 ms | p99 ms | on / off | on / Redis | on / floor |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    sends = {}
    for r in by.get("sends", []):
        sends[(r["body"], r["conns"], r["fsync"])] = r
    for r in by.get("redis", []):
        sends[(r["body"], r["conns"], "redis")] = r
    for body in ("1024", "16384"):
        for conns in ("1", "16", "64", "256"):
            on = sends.get((body, conns, "true"), {})
            off = sends.get((body, conns, "false"), {})
            rd = sends.get((body, conns, "redis"), {})
            size = "1 KiB" if body == "1024" else "16 KiB"
            out.append(
                f"| {size} | {conns} | {show(on.get('sends_per_s'))} | {ms(on.get('p50_us'))} | {ms(on.get('p99_us'))} "
                f"| {show(off.get('sends_per_s'))} | {ms(off.get('p50_us'))} | {ms(off.get('p99_us'))} "
                f"| {show(rd.get('sends_per_s'))} | {ms(rd.get('p50_us'))} | {ms(rd.get('p99_us'))} "
                f"| {fmt_ratio(ratio(on.get('sends_per_s'), off.get('sends_per_s')))} "
                f"| {fmt_ratio(ratio(on.get('sends_per_s'), rd.get('sends_per_s')))} "
                f"| {fmt_ratio(ratio(on.get('sends_per_s'), floor_rps))} |"
            )
    errors = [r for r in by.get("sends", []) if r.get("non_2xx", "0") != "0" or r.get("socket_errors", "0") != "0"]
    out.append("")
    out.append(f"Send runs with non-2xx answers or socket errors: {len(errors)}.")
    out.append("")

    pulls = {r.get("consumers"): r for r in by.get("pull", [])}
    pull = pulls.get("8", {})
    pull2 = pulls.get("2", {})
    pushes = by.get("push", [])
    push = median(pushes, "push_delivered_per_s")
    halves = by.get("pushhalf", [])
    half = median(halves, "push_p99_ms")
    relays = by.get("relay", [])
    relay = median(relays, "push_delivered_per_s")
    replays = by.get("replay", [])
    replay = median(replays, "replay_ms")
    replay_rps = num(replay.get("records")) * 1000 / num(replay.get("replay_ms")) if replay else float("nan")
    # Memory: the largest of the trials, not the median.
    def bytes_per_msg(r):
        return (num(r.get("rss_full_kib")) - num(r.get("rss_empty_kib"))) * 1024 / num(r.get("messages"))
    memory = max(replays, key=bytes_per_msg, default={})
    memory_bpm = bytes_per_msg(memory) if memory else float("nan")
    slow = {r["conns"]: r for r in by.get("slowdisk", [])}
    out.append("### Pull, push, replay, memory, a slow disk")
    out.append("")
    out.append("| measurement | result |")
    out.append("|---|---:|")
    out.append(f"| pull: 8 consumers (wrk threads) × 8 connections, receive-batch of 100 + an ack for each, fsync on | {show(pull.get('pull_msgs_per_s'))} messages/s |")
    out.append(f"| pull: the same 64 connections as 2 consumers | {show(pull2.get('pull_msgs_per_s'))} messages/s |")
    out.append(f"| push end to end: 64 clients forwarding {show(push.get('push_msgs'))} × 1 KiB, `concurrency = 64`, a local destination; median of {len(pushes)} trials ({trials(pushes, 'push_delivered_per_s')}) | {show(push.get('push_delivered_per_s'))} delivered/s |")
    out.append(f"| push: spoold's CPU per message (the median trial) | {show(push.get('push_cpu_us_per_msg'))} µs |")
    out.append(f"| push: forward request issued (its `202` included) → arrival at the destination, as fast as it goes (the median trial) | p50 {show(push.get('push_p50_ms'))} ms, p99 {show(push.get('push_p99_ms'))} ms |")
    out.append(f"| the same load through a bare relay on hyper (`examples/relay.rs`: `202` once the body is in memory, no journal, no fsync; 64 workers post to the destination), the bound of push here; median of {len(relays)} trials ({trials(relays, 'push_delivered_per_s')}) | {show(relay.get('push_delivered_per_s'))} delivered/s ({fmt_ratio(ratio(relay.get('push_delivered_per_s'), floor_rps))} the floor), {show(relay.get('push_cpu_us_per_msg'))} µs of CPU per message |")
    out.append(f"| push ÷ the relay, trial by trial (delivered/s; CPU per message) | {pair_ratios(pushes, relays)} |")
    allocs = (by.get("pushallocs") or [{}])[-1]
    if allocs:
        per_msg = num(allocs.get("allocations")) / num(allocs.get("messages"))
        out.append(f"| push: heap allocations per message, the whole process (feature `count-allocations`; two runs of 10 000 and 40 000 messages, the difference) | {per_msg:.1f} |")
    out.append(f"| push: the same at half the rate of its trial, open loop (each forward timed from its appointed instant); the median p99 of {len(halves)} trials | p50 {show(half.get('push_p50_ms'))} ms, p99 {show(half.get('push_p99_ms'))} ms at {show(half.get('rate'))}/s |")
    out.append(f"| replay of {show(replay.get('messages'))} messages, 1 KiB each, page cache warm; median of {len(replays)} trials ({trials(replays, 'replay_ms')} ms) | {replay_rps:.0f} records/s |")
    out.append(f"| resident memory per queued message, the largest of the trials | {memory_bpm:.0f} bytes |")
    out.append(f"| journal bytes per 1 KiB message | {show(replay.get('journal_bytes_per_msg'))} bytes |")
    for conns in ("1", "64"):
        s = slow.get(conns, {})
        out.append(f"| every fdatasync delayed 2 ms: durable sends/s at {conns} connection{'s' if conns != '1' else ''} | {show(s.get('sends_per_s'))} (p50 {ms(s.get('p50_us'))} ms, p99 {ms(s.get('p99_us'))} ms) |")
    out.append("")

    on64 = sends.get(("1024", "64", "true"), {})
    off64 = sends.get(("1024", "64", "false"), {})
    rd64 = sends.get(("1024", "64", "redis"), {})
    targets = [
        ("durable sends/s at 64 connections ≥ 1.0 × Redis LPUSH (appendfsync always)",
         ratio(on64.get("sends_per_s"), rd64.get("sends_per_s")), 1.0, "min"),
        ("durable sends/s at 64 connections ≥ 0.8 × spoold with fsync off",
         ratio(on64.get("sends_per_s"), off64.get("sends_per_s")), 0.8, "min"),
        (f"p99 of sends at 64 connections ≤ 1 × Redis's, at ≥ 1 × its rate, in ≥ {TAIL_TRIALS_NEEDED} "
         "of 3 trials (section tail, below): trials that met it",
         sum(tail_met(sp, rd) for _, sp, rd in tail_pairs(by.get("tail", []))) if by.get("tail") else float("nan"),
         TAIL_TRIALS_NEEDED, "min", "of the trials"),
        (f"pull (8 consumers) ≥ {PULL_PER_FLOOR:.3f} × the floor",
         ratio(pull.get("pull_msgs_per_s"), floor_rps), PULL_PER_FLOOR, "min"),
        (f"push delivered/s ≥ {PUSH_PER_RELAY} × the relay's (median of the trials' ratios)",
         median_ratio(pushes, relays, "push_delivered_per_s"), PUSH_PER_RELAY, "min"),
        (f"push: spoold's CPU per message ≤ {PUSH_CPU_PER_RELAY_MAX} × the relay's (median of the trials' ratios)",
         median_ratio(pushes, relays, "push_cpu_us_per_msg"), PUSH_CPU_PER_RELAY_MAX, "max"),
        (f"push p99, forward → arrival at half the measured rate, ≤ {PUSH_P99_MS_MAX} ms",
         num(half.get("push_p99_ms")), PUSH_P99_MS_MAX, "max", "ms"),
        (f"replay records/s ≥ {REPLAY_PER_FLOOR:.2f} × the floor's requests/s",
         replay_rps / floor_rps if floor_rps else float("nan"), REPLAY_PER_FLOOR, "min"),
    ]
    out.append("### Against the targets (1 KiB bodies)")
    out.append("")
    out.append("| target | this run | |")
    out.append("|---|---:|---|")
    for name, value, bound, kind, *unit in targets:
        if value != value:
            verdict = "not measured"
        else:
            ok = value >= bound if kind == "min" else value <= bound
            verdict = "met" if ok else "**not met**"
        if value != value:
            shown = "–"
        elif unit:
            shown = f"{value:g} {unit[0]}"
        else:
            shown = f"{value:.0f}" if kind == "max" and bound > 10 else f"{value:.2f} ×"
        out.append(f"| {name} | {shown} | {verdict} |")
    mem_ok = "not measured" if memory_bpm != memory_bpm else ("met" if memory_bpm <= RSS_BYTES_PER_MESSAGE_MAX else "**not met**")
    out.append(f"| ≤ {RSS_BYTES_PER_MESSAGE_MAX} bytes of RAM per queued message (memory does not move with the machine's speed) | {memory_bpm:.0f} | {mem_ok} |")
    out.append("")
    if relay:
        out.append(
            f"The bare relay of the same trials (`examples/relay.rs`, no journal): "
            f"{fmt_ratio(ratio(relay.get('push_delivered_per_s'), floor_rps))} the floor, "
            f"{show(relay.get('push_cpu_us_per_msg'))} µs of CPU per message (median trial). "
            "spoold also writes and fsyncs each message and its settle, and leases it."
        )
        out.append("")
    tail_section(out, by.get("tail", []))

    clusters = by.get("cluster", [])
    if section(out, "A 3-replica cluster beside a single node (trials interleaved)", clusters, "cluster",
               "Durable 1 KiB sends at 64 connections to the primary (wrk); the three replicas "
               "share this machine's cores and disk. CPU: µs of each process per acknowledged message. "
               "Medians of the trials.",
               "| setup | sends/s | × single node | p50 ms | p99 ms | CPU µs per message, each replica |",
               "|---|---:|---:|---:|---:|---|"):
        single = [r for r in clusters if r.get("replicas") == "1"]
        three = [r for r in clusters if r.get("replicas") == "3"]
        base = num(median(single, "sends_per_s").get("sends_per_s")) if single else float("nan")
        for name, rs in (("single node", single), ("3 replicas", three)):
            if not rs:
                continue
            m = median(rs, "sends_per_s")
            v = num(m.get("sends_per_s"))
            cpus = " / ".join(show(m.get(f"cpu_us_per_msg_{i}")) for i in (1, 2, 3) if m.get(f"cpu_us_per_msg_{i}"))
            out.append(f"| {name} ({len(rs)} trials) | {v:.0f} | {fmt_ratio(v / base)} | {ms(m.get('p50_us'))} "
                       f"| {ms(m.get('p99_us'))} | {cpus} |")
        out.append("")
        v3 = num(median(three, "sends_per_s").get("sends_per_s")) if three else float("nan")
        aim = v3 / base
        verdict = "not measured" if aim != aim else ("met" if aim >= 1 / 3 else "**not met**")
        out.append(f"Aim: a 3-replica cluster at least a third of the single node's durable sends/s: "
                   f"{fmt_ratio(aim)}, {verdict}.")
        out.append("")

    catchups = by.get("catchup", [])
    if section(out, "Catch-up by snapshot", catchups, "catchup",
               "A follower of a 3-replica cluster is down while wrk sends 1 KiB messages to the primary "
               "(every message kept); the primary purges its log; the follower comes back and receives "
               "the checkpoint streamed with every payload it points at. Time: from its start to having "
               "applied everything committed before it. Memory: its peak resident set (VmHWM), beside the "
               "primary's, which holds the same state and sent the snapshot.",
               "| trial | messages | snapshot MiB | seconds | MiB/s | follower peak RSS MiB | primary peak RSS MiB | follower RSS / snapshot |",
               "|---|---:|---:|---:|---:|---:|---:|---:|"):
        for r in catchups:
            mib = num(r.get("snapshot_bytes")) / (1 << 20)
            secs = num(r.get("seconds"))
            rss = num(r.get("follower_peak_rss_kib")) / 1024
            prss = num(r.get("primary_peak_rss_kib")) / 1024
            out.append(f"| {r.get('trial')} | {num(r.get('messages')):.0f} | {mib:.1f} | {secs:.2f} "
                       f"| {mib / secs if secs else float('nan'):.1f} | {rss:.1f} | {prss:.1f} "
                       f"| {rss / mib if mib else float('nan'):.2f} |")
        out.append("")

    jets = by.get("jetstream", [])
    if section(out, "Side by side: NATS JetStream R3", jets, "jetstream",
               "Three local `nats-server` with JetStream (file storage, a stream of 3 replicas, routes "
               "between them) and spoold's 3-replica cluster, one after the other in each trial, on this "
               "machine: 1 KiB messages, 64 clients each waiting for its acknowledgement "
               "(`examples/jetstream_load.rs` publishes with a reply inbox; wrk sends to spoold's primary). "
               "fsyncs per acknowledged message: per replica (spoold: from its fsync histogram's count; "
               "JetStream: `strace -f -c` of one server during a second run). Medians of the trials.",
               "| system | messages/s | p50 ms | p99 ms | fsyncs per acknowledged message, per replica |",
               "|---|---:|---:|---:|---:|"):
        for system, name in (("spoold-r3", "spoold, 3 replicas"), ("nats-jetstream-r3", "NATS JetStream R3")):
            rs = [r for r in jets if r.get("system") == system]
            if not rs:
                continue
            m = median(rs, "sends_per_s")
            version = f" {m['version']}" if m.get("version") else ""
            fs = num(m.get("fsyncs_per_msg"))
            note = " (JetStream 2.9 does not fsync per message: it writes to the page cache and syncs every 2 minutes by default; a power loss can take acknowledged messages)" if system.startswith("nats") and fs < 0.01 else ""
            out.append(f"| {name}{version} ({len(rs)} trials) | {num(m.get('sends_per_s')):.0f} | {ms(m.get('p50_us'))} "
                       f"| {ms(m.get('p99_us'))} | {fs:.3f}{note} |")
        out.append("")

    bulls = by.get("bullmq", [])
    if section(out, "Side by side: BullMQ on Redis", bulls, "bullmq",
               "What a Node team would run instead of spoold's push: BullMQ on Redis with `appendonly yes`, "
               "`appendfsync always`, its `Worker` (concurrency 64) posting each job's 1 KiB body to a "
               "destination with a keep-alive agent (`bench/bullmq/push.mjs`). Its producer adds the jobs "
               "from 64 loops and serves the destination, as `examples/load.rs push` does for spoold; in "
               "each trial both run as fast as they go (delivered/s, CPU per message), then each at half "
               "its own rate, open loop, for latency: the add (or forward) issued, its answer included, to "
               "the first arrival. CPU per message: spoold's process; for BullMQ, Redis's plus the "
               "worker's (together they do what spoold does). Medians of the trials.",
               "| system | delivered/s | CPU µs per message | at half its rate: p50 ms | p99 ms |",
               "|---|---:|---:|---:|---:|"):
        got = {}
        for system, prefix in (("spoold", "push"), ("bullmq", "bullmq")):
            rs = [r for r in bulls if r.get("system") == system]
            most = [r for r in rs if r.get("load") == "max"]
            halfs = [r for r in rs if r.get("load") == "half"]
            if not most:
                continue
            m = median(most, f"{prefix}_delivered_per_s")
            h = median(halfs, f"{prefix}_p99_ms")
            got[system] = (num(m.get(f"{prefix}_delivered_per_s")), num(m.get(f"{prefix}_cpu_us_per_msg")),
                           num(h.get(f"{prefix}_p99_ms")))
            name, detail = "spoold push", ""
            if system == "bullmq":
                detail = (f" (Redis {show(m.get('bullmq_redis_cpu_us_per_msg'))} + worker "
                          f"{show(m.get('bullmq_worker_cpu_us_per_msg'))})")
                name = f"BullMQ {m.get('bullmq', '')}, Redis {m.get('redis', '')}, Node {m.get('node', '')}"
            out.append(f"| {name} ({len(most)} trials) | {show(m.get(f'{prefix}_delivered_per_s'))} "
                       f"| {show(m.get(f'{prefix}_cpu_us_per_msg'))}{detail} | {show(h.get(f'{prefix}_p50_ms'))} "
                       f"| {show(h.get(f'{prefix}_p99_ms'))} (at {show(h.get('rate'))}/s) |")
        if len(got) == 2:
            (sd, sc, sp), (bd, bc, bp) = got["spoold"], got["bullmq"]
            out.append("")
            out.append(f"spoold ÷ BullMQ: delivered/s {fmt_ratio(ratio(sd, bd))}, CPU per message "
                       f"{fmt_ratio(ratio(sc, bc))}, p99 at half rate {fmt_ratio(ratio(sp, bp))}.")
        out.append("")

    svix_section(out, by.get("svix", []))

    tenant_rows = by.get("tenants", [])
    if section(out, "A tenant's key beside an operator's (trials interleaved)", tenant_rows, "tenants",
               "One spool with 1 000 tenants' push queues (paused: nothing is delivered) and two keys: an "
               "operator's (`admin`, no tenant) and tenant `t7`'s (`queues = [\"t7-*\"]`). wrk at 64 "
               "connections sends 1 KiB bodies to `t7-hooks` (durable) and reads it "
               "(`GET /v1/queues/t7-hooks`) with each key in turn, the order alternating by trial. "
               "Medians of the trials.",
               "| request | operator: requests/s | p99 ms | tenant: requests/s | p99 ms | tenant ÷ operator, requests/s | p99 |",
               "|---|---:|---:|---:|---:|---:|---:|"):
        for request in ("send", "get"):
            got = {}
            for key in ("operator", "tenant"):
                rs = [r for r in tenant_rows if r.get("key") == key and r.get("request") == request]
                got[key] = (median(rs, "sends_per_s"), median(rs, "p99_us"))
            (o, op), (t, tp) = got["operator"], got["tenant"]
            out.append(f"| {request} | {show(o.get('sends_per_s'))} | {ms(op.get('p99_us'))} "
                       f"| {show(t.get('sends_per_s'))} | {ms(tp.get('p99_us'))} "
                       f"| {fmt_ratio(ratio(t.get('sends_per_s'), o.get('sends_per_s')))} "
                       f"| {fmt_ratio(ratio(tp.get('p99_us'), op.get('p99_us')))} |")
        out.append("")

    ends = by.get("endpoints", [])
    if section(out, "Endpoints: webhooks to many customers", ends, "endpoints",
               "Push queues created over the API (each a customer endpoint with a destination, a signing "
               "secret and event patterns), on a fresh spool: spoold's resident memory per queue (after "
               "creating them, less before) and its CPU while they idle; one event to 1 000 of them "
               "(median of 5: the `202` comes once every delivery is enqueued, one record); one event to "
               "10 000 of them, from its `202` until the destination had each. The five events to 1 000 go "
               "200 ms apart, so each finds the endpoints still delivering the one before. `before`: the "
               "build before events and sleeping dispatchers (`cb303e2`), without events, measured 5 s "
               "after its queues were created (it was still building a client per queue). The list: "
               "`GET /v1/queues?limit=100`, the console's first page, and the same under a name prefix "
               "(its filter box), median of 5 each; target under 200 ms.",
               "| build | queues | bytes per queue | ≤ 2 048 | idle CPU % | 1 000 subscribers: 202 ms | < 50 | 10 000 delivered, s | < 10 | RSS after, MiB | list page / prefix, ms | < 200 |",
               "|---|---:|---:|---|---:|---:|---|---:|---|---:|---:|---|"):
        for r in ends:
            per = num(r.get("endpoints_bytes_per_queue"))
            fan = num(r.get("endpoints_fanout_p50_ms"))
            wide = num(r.get("endpoints_wide_seconds"))
            yes = lambda ok, v: "—" if v != v else ("yes" if ok else "**no**")
            out.append(f"| {r.get('build')} | {num(r.get('endpoints_queues')):.0f} | {per:.0f} | {yes(per <= 2048, per)} "
                       f"| {num(r.get('endpoints_idle_cpu_pct')):.2f} | {show(r.get('endpoints_fanout_p50_ms'))} "
                       f"| {yes(fan < 50, fan)} | {show(r.get('endpoints_wide_seconds'))} | {yes(wide < 10, wide)} "
                       f"| {show(r.get('endpoints_rss_after_mib'))} "
                       f"| {show(r.get('endpoints_list_page_ms'))} / {show(r.get('endpoints_list_prefix_ms'))} "
                       f"| {yes(max(num(r.get('endpoints_list_page_ms')), num(r.get('endpoints_list_prefix_ms'))) < 200, num(r.get('endpoints_list_page_ms')))} |")
        out.append("")

    searches = by.get("search", [])
    if section(out, "Search pages beside /healthz", searches, "search",
               "`bench/search.py`: 200 JSON bodies of 1 MiB in a pull queue; 8 threads ask peek pages "
               "as fast as they are answered, alternately a 1 KiB `contains` that almost matches at "
               "every byte and a `match` that parses every body; a probe asks `/healthz` every 20 ms, "
               "alone for 3 s, then while they run (15 s). Target: /healthz p99 ≤ 100 ms meanwhile.",
               "| searchers | /healthz p50 / p99 alone, ms | p50 / p99 / max meanwhile, ms | ≤ 100 | pages | refused (429) | page p50 / p99, ms |",
               "|---:|---:|---:|---|---:|---:|---:|"):
        for r in searches:
            p99 = num(r.get("healthz_p99_ms"))
            out.append(f"| {r.get('searchers')} | {r.get('healthz_idle_p50_ms')} / {r.get('healthz_idle_p99_ms')} "
                       f"| {r.get('healthz_p50_ms')} / {r.get('healthz_p99_ms')} / {r.get('healthz_max_ms')} "
                       f"| {'yes' if p99 <= 100 else '**no**'} | {r.get('pages')} | {r.get('refused')} "
                       f"| {r.get('page_p50_ms')} / {r.get('page_p99_ms')} |")
        out.append("")

    fans = by.get("fanout", [])
    if section(out, "Fan-out memory per delivery", fans, "search",
               "`bench/search.py`: pull queues subscribed to `t.>`, then small events to all of them; "
               "the process's RSS after, less before, per delivery, beside the memory account "
               "(`spool/state/memory.rs`) that `spool.max_memory` bounds. Target: ≤ 90 bytes.",
               "| queues | events | deliveries | RSS before → after, MiB | bytes per delivery | ≤ 90 | accounted, MiB |",
               "|---:|---:|---:|---:|---:|---|---:|"):
        for r in fans:
            per = num(r.get("rss_bytes_per_delivery"))
            out.append(f"| {r.get('queues')} | {r.get('events')} | {r.get('deliveries')} "
                       f"| {r.get('rss_before_mib')} → {r.get('rss_after_mib')} | {per:.1f} "
                       f"| {'yes' if per <= 90 else '**no**'} | {r.get('accounted_mib')} |")
        out.append("")

    filters = by.get("filters", [])
    if section(out, "Content filters beside the same fan-out without them", filters, "filters",
               "`bench/filters.py`: 100 pull queues subscribed to `order.>`; one client publishes 3 000 "
               "events (about 300 bytes of JSON) one after another, each answered after its fsync: with "
               "no filter; with a filter on every queue (a numeric range, a prefix and an `anything-but`) "
               "that every event passes, so the same deliveries are written; and with filters that half "
               "the queues pass.",
               "| filters | deliveries per event | `202` p50 / p99, ms | events/s | × none |",
               "|---|---:|---:|---:|---:|"):
        for r in filters:
            out.append(f"| {r.get('mode', '').replace('_', ' ')} | {r.get('deliveries_per_event')} "
                       f"| {r.get('p50_ms')} / {r.get('p99_ms')} | {r.get('events_per_s')} | {r.get('vs_none')} |")
        out.append("")

    orders = by.get("ordering", [])
    if section(out, "Ordered push beside unordered (trials interleaved)", orders, "ordering",
               "`examples/load.rs push` on the `hooks` push queue (concurrency 64) as the push section "
               "runs it: unordered without keys; `ordering = \"per_key\"` with 10 000 keys (message "
               "`i` has key `k{i % N}`: each key's bookkeeping, every message in flight at once as "
               "unordered); and with 64 keys (as many as the queue's concurrency: each key waits for "
               "its previous delivery's answer). Medians of the trials.",
               "| ordering | keys | delivered/s | × unordered | spoold CPU µs per message | × unordered | p99 202 → arrival, ms |",
               "|---|---:|---:|---:|---:|---:|---:|"):
        shapes = []
        for r in orders:
            shape = (r.get("ordering"), r.get("keys"))
            if shape not in shapes:
                shapes.append(shape)
        base = {}
        for ordering, keys in shapes:
            rs = [r for r in orders if (r.get("ordering"), r.get("keys")) == (ordering, keys)]
            rate = num(median(rs, "push_delivered_per_s").get("push_delivered_per_s"))
            cpu = num(median(rs, "push_cpu_us_per_msg").get("push_cpu_us_per_msg"))
            p99 = median(rs, "push_p99_ms").get("push_p99_ms")
            if ordering == "none":
                base = {"rate": rate, "cpu": cpu}
            out.append(f"| {ordering} | {keys} | {rate:.0f} | {fmt_ratio(rate / base.get('rate', float('nan')))} "
                       f"| {cpu:.0f} | {fmt_ratio(cpu / base.get('cpu', float('nan')))} | {p99} |")
        out.append("")

    allocs = by.get("alloc", [])
    if section(out, "Allocators, side by side (trials interleaved)", allocs, "alloc",
               "`jemalloc` is the default build; `glibc-tuned` is glibc with "
               "`GLIBC_TUNABLES=glibc.malloc.tcache_count=1000:glibc.malloc.top_pad=16777216`. "
               "Medians of the trials; memory is the largest.",
               "| allocator | durable sends/s, 64 conns | × glibc | push: spoold CPU µs per message | × glibc | RAM bytes per queued message | ≤ 200 |",
               "|---|---:|---:|---:|---:|---:|---|"):
        base = {}
        table = []
        for variant in ("jemalloc", "glibc", "glibc-tuned", "mimalloc"):
            rs = [r for r in allocs if r.get("variant") == variant]
            if not rs:
                continue
            sends_v = num(median(rs, "sends_per_s").get("sends_per_s"))
            cpu_v = num(median(rs, "push_cpu_us_per_msg").get("push_cpu_us_per_msg"))
            mem_v = max(bytes_per_msg(r) for r in rs)
            table.append((variant, sends_v, cpu_v, mem_v, len(rs)))
        base = next(({"sends": t[1], "cpu": t[2]} for t in table if t[0] == "glibc"), {})
        for variant, sends_v, cpu_v, mem_v, n in table:
            out.append(f"| {variant} ({n} trials) | {sends_v:.0f} | {fmt_ratio(sends_v / base.get('sends', float('nan')))} "
                       f"| {cpu_v:.0f} | {fmt_ratio(cpu_v / base.get('cpu', float('nan')))} | {mem_v:.0f} "
                       f"| {'yes' if mem_v <= RSS_BYTES_PER_MESSAGE_MAX else '**no**'} |")
    return "\n".join(out) + "\n"


def main():
    table = report(parse(sys.argv[1]))
    print(table)
    text = open(DOC).read()
    block = f"{BEGIN}\n{table}{END}"
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    open(DOC, "w").write(text)
    print(f"written to {DOC}", file=sys.stderr)


if __name__ == "__main__":
    main()
