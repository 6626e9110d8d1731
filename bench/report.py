#!/usr/bin/env python3
"""Turns the RESULT lines of bench/run.sh into the tables of
docs/performance.md (between the bench:run.sh markers) and prints them.

Usage: report.py RESULTS_FILE REDIS_VERSION
"""
import datetime
import os
import platform
import re
import subprocess
import sys

BEGIN = "<!-- bench:run.sh:begin -->"
END = "<!-- bench:run.sh:end -->"


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
    return float(v) if v not in (None, "") else float("nan")


def median(rows, key):
    """The row with the median `key` (the lower middle of an even count)."""
    ranked = sorted(rows, key=lambda r: num(r.get(key)))
    return ranked[(len(ranked) - 1) // 2] if ranked else {}


def trials(rows, key):
    """Every trial's `key`, in the order run: "a, b, c"."""
    return ", ".join(str(r.get(key)) for r in rows)


def machine():
    cpu = "unknown CPU"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    cores = os.cpu_count()
    mem = 0
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal"):
            mem = int(line.split()[1]) // (1024 * 1024)
    fs = subprocess.run(["df", "-T", "."], capture_output=True, text=True).stdout.splitlines()[-1].split()[1]
    return f"{cores} vCPU {cpu}, {mem} GiB, Linux {platform.release()}, {fs} on a virtio disk"


def ms(us):
    return f"{num(us) / 1000:.2f}"


def main():
    rows = parse(sys.argv[1])
    redis_version = sys.argv[2] if len(sys.argv) > 2 else "?"
    out = []
    today = datetime.date.today().isoformat()
    out.append(f"Last run: {today}, {machine()}; Redis {redis_version}.")
    out.append("")
    out.append("### Sends over HTTP: spoold (wrk) and Redis LPUSH with `appendfsync always` (redis-benchmark)")
    out.append("")
    out.append("| body | conns | spoold fsync on: sends/s | p50 ms | p99 ms | fsync off: sends/s | p50 ms | p99 ms | Redis: LPUSH/s | p50 ms | p99 ms | on / off | on / Redis |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    sends = {}
    for r in rows:
        if r["what"] == "spoold":
            sends[(r["body"], r["conns"], r["fsync"])] = r
        elif r["what"] == "redis":
            sends[(r["body"], r["conns"], "redis")] = r
    for body in ("1024", "16384"):
        for conns in ("1", "16", "64", "256"):
            on = sends.get((body, conns, "true"), {})
            off = sends.get((body, conns, "false"), {})
            rd = sends.get((body, conns, "redis"), {})
            ratio_off = num(on.get("sends_per_s")) / num(off.get("sends_per_s"))
            ratio_redis = num(on.get("sends_per_s")) / num(rd.get("sends_per_s"))
            size = "1 KiB" if body == "1024" else "16 KiB"
            out.append(
                f"| {size} | {conns} | {on.get('sends_per_s')} | {ms(on.get('p50_us'))} | {ms(on.get('p99_us'))} "
                f"| {off.get('sends_per_s')} | {ms(off.get('p50_us'))} | {ms(off.get('p99_us'))} "
                f"| {rd.get('sends_per_s')} | {ms(rd.get('p50_us'))} | {ms(rd.get('p99_us'))} "
                f"| {ratio_off:.2f} | {ratio_redis:.2f} |"
            )
    floor = next((r for r in rows if r["what"] == "floor"), {})
    out.append(
        f"| (floor) | 64 | GET /healthz: {floor.get('sends_per_s')} req/s | {ms(floor.get('p50_us'))} | {ms(floor.get('p99_us'))} "
        "| | | | | | | | |"
    )
    errors = [r for r in rows if r["what"] == "spoold" and (r.get("non_2xx", "0") != "0" or r.get("socket_errors", "0") != "0")]
    out.append("")
    out.append(f"Runs with non-2xx answers or socket errors: {len(errors)}.")
    out.append("")

    pulls = {r.get("consumers"): r for r in rows if r["what"] == "pull"}
    pull = pulls.get("8", {})
    pull2 = pulls.get("2", {})
    pushes = [r for r in rows if r["what"] == "push"]
    push = median(pushes, "push_delivered_per_s")
    replays = [r for r in rows if r["what"] == "replay"]
    replay = median(replays, "records_per_s")
    # Memory: the largest of the trials, not the median.
    memory = max(replays, key=lambda r: num(r.get("rss_bytes_per_msg")), default={})
    slow = {r["conns"]: r for r in rows if r["what"] == "slowdisk"}
    out.append("### Pull, push, replay, memory, a slow disk")
    out.append("")
    out.append("| measurement | result |")
    out.append("|---|---:|")
    out.append(f"| pull: 8 consumers (wrk threads) × 8 connections, receive-batch of 100 + an ack for each, fsync on ({pull.get('pull_acked')} acked) | {pull.get('pull_msgs_per_s')} messages/s |")
    out.append(f"| pull: the same 64 connections as 2 consumers ({pull2.get('pull_acked')} acked) | {pull2.get('pull_msgs_per_s')} messages/s |")
    out.append(f"| push end to end: 64 clients forwarding {push.get('push_msgs')} × 1 KiB, `concurrency = 64`, a local destination; median of {len(pushes)} trials ({trials(pushes, 'push_delivered_per_s')}) | {push.get('push_delivered_per_s')} delivered/s (accepted {push.get('push_accepted_per_s')}/s) |")
    out.append(f"| push: forward request issued (its `202` included) → arrival at the destination (the median trial) | p50 {push.get('push_p50_ms')} ms, p99 {push.get('push_p99_ms')} ms |")
    out.append(f"| replay of {replay.get('messages')} messages ({replay.get('records')} records), 1 KiB each, page cache warm; median of {len(replays)} trials ({trials(replays, 'replay_ms')} ms) | {num(replay.get('replay_ms')) / 1000:.2f} s, {replay.get('records_per_s')} records/s |")
    out.append(f"| resident memory per queued message, the largest of the trials (RSS {memory.get('rss_empty_kib')} KiB empty → {memory.get('rss_full_kib')} KiB full) | {memory.get('rss_bytes_per_msg')} bytes |")
    out.append(f"| journal bytes per 1 KiB message | {replay.get('journal_bytes_per_msg')} bytes |")
    for conns in ("1", "64"):
        s = slow.get(conns, {})
        out.append(f"| every fdatasync delayed 2 ms: durable sends/s at {conns} connection{'s' if conns != '1' else ''} | {s.get('sends_per_s')} (p50 {ms(s.get('p50_us'))} ms, p99 {ms(s.get('p99_us'))} ms) |")
    out.append("")

    on64 = num(sends.get(("1024", "64", "true"), {}).get("sends_per_s"))
    off64 = num(sends.get(("1024", "64", "false"), {}).get("sends_per_s"))
    rd64 = num(sends.get(("1024", "64", "redis"), {}).get("sends_per_s"))
    p99on = num(sends.get(("1024", "64", "true"), {}).get("p99_us"))
    p99rd = num(sends.get(("1024", "64", "redis"), {}).get("p99_us"))

    def verdict(ok):
        return "met" if ok else "**not met**"

    targets = [
        ("durable sends/s at 64 connections ≥ 1.0 × Redis", f"{on64 / rd64:.2f} ×", on64 >= rd64),
        ("durable sends/s at 64 connections ≥ 0.8 × spoold fsync off", f"{on64 / off64:.2f} ×", on64 >= 0.8 * off64),
        ("p99 at 64 connections ≤ 2 × Redis's p99", f"{p99on / p99rd:.2f} ×", p99on <= 2 * p99rd),
        ("pull ≥ 20 000 messages/s", pull.get("pull_msgs_per_s"), num(pull.get("pull_msgs_per_s")) >= 20000),
        ("push end to end ≥ 15 000 messages/s", push.get("push_delivered_per_s"), num(push.get("push_delivered_per_s")) >= 15000),
        ("replay ≥ 1 M records/s", replay.get("records_per_s"), num(replay.get("records_per_s")) >= 1e6),
        ("≤ 200 bytes of RAM per queued message", memory.get("rss_bytes_per_msg"), num(memory.get("rss_bytes_per_msg")) <= 200),
    ]
    out.append("### Against the targets (1 KiB bodies)")
    out.append("")
    out.append("| target | this run | |")
    out.append("|---|---:|---|")
    for name, value, ok in targets:
        out.append(f"| {name} | {value} | {verdict(ok)} |")
    table = "\n".join(out) + "\n"
    print(table)

    doc = "docs/performance.md"
    text = open(doc).read()
    block = f"{BEGIN}\n{table}{END}"
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    open(doc, "w").write(text)
    print(f"written to {doc}", file=sys.stderr)


if __name__ == "__main__":
    main()
