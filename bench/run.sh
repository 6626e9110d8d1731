#!/usr/bin/env bash
# The performance run of issue 8, in one go on this machine: spoold's sends
# over HTTP (wrk) at 1/16/64/256 connections with fsync on and off and 1 KiB
# and 16 KiB bodies; Redis LPUSH with appendfsync always (redis-benchmark) at
# the same concurrency and sizes; pull (receive-batch + ack, 8 consumers, wrk);
# push end to end; replay of a 1 M-message spool with resident memory and
# journal bytes per message; and durable sends with every fdatasync delayed
# by 2 ms (strace), as on a cloud block device.
#
# Load generators and servers share the two cores: compare the figures of
# one run with each other, not across runs. Writes the table to
# docs/performance.md (between the bench:run.sh markers) and prints it.
#
#   bench/run.sh                 # about 6 minutes
#   DURATION=10 bench/run.sh     # seconds per wrk run (default 5)
#   TRIALS=5 bench/run.sh        # trials of push and replay (default 3)
#   REPLAY_MESSAGES=200000 bench/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
DURATION=${DURATION:-5}
REPLAY_MESSAGES=${REPLAY_MESSAGES:-1000000}
PULL_MESSAGES=${PULL_MESSAGES:-200000}   # enough for DURATION seconds
PUSH_MESSAGES=${PUSH_MESSAGES:-50000}
# Push (about 3 s) and replay (about 1 s) are shorter than one wrk run, and
# a moment of the shared machine's slowness decides a single one: each is
# measured this many times and the median reported (all are printed).
TRIALS=${TRIALS:-3}
PORT=${PORT:-18787}
REDIS_PORT=${REDIS_PORT:-18788}
SINK_PORT=${SINK_PORT:-18789}

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
command -v strace >/dev/null || need+=(strace)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "== building (release)" >&2
cargo build --release --quiet --bin spoold --example load
spoold_bin=$root/target/release/spoold
load_bin=$root/target/release/examples/load

# The spools live on the project's disk (not a tmpfs /tmp): fsync must be real.
work=$(mktemp -d "$root/target/bench.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
results=$work/results.txt
: >"$results"
result() { echo "$*" | tee -a "$results" >&2; }

# start_spoold NAME FSYNC [WRAPPER...]: a fresh spool; waits until ready.
spoold_pid=""
start_spoold() {
  local name=$1 fsync=$2; shift 2
  local dir=$work/$name
  rm -rf "$dir"; mkdir -p "$dir"
  cat >"$dir/spoold.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
[spool]
dir = "$dir/spool"
fsync = $fsync
max_bytes = "64GiB"
[log]
level = "info"
[queues.bench]
[queues.hooks]
destination = "http://127.0.0.1:$SINK_PORT/in"
concurrency = 64
TOML
  "$@" "$spoold_bin" run --config "$dir/spoold.toml" 2>"$dir/log" &
  spoold_pid=$!
  pids+=("$spoold_pid")
  for _ in $(seq 1 1200); do
    curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && return 0
    kill -0 "$spoold_pid" 2>/dev/null || { cat "$dir/log" >&2; return 1; }
    sleep 0.05
  done
  echo "spoold never became ready" >&2; return 1
}
stop_spoold() {
  # Signal spoold itself: under strace, $spoold_pid is strace, which would
  # only detach.
  pkill -TERM -f -- "--config $work/.*/spoold.toml" 2>/dev/null || true
  wait "$spoold_pid" 2>/dev/null || true
  spoold_pid=""
}
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }

field() { # field KEY LINE
  sed -n "s/.*[ ^]$1=\([^ ]*\).*/\1/p" <<<" $2"
}

SKIP=${SKIP:-}   # e.g. SKIP="sends redis" to run only the other parts
skip() { [[ " $SKIP " == *" $1 "* ]]; }

skip sends || { echo "== spoold sends over HTTP (wrk, ${DURATION}s each)" >&2
for body in 1024 16384; do
  for conns in 1 16 64 256; do
    for fsync in true false; do
      start_spoold "sends-$fsync" "$fsync"
      threads=2; [ "$conns" -eq 1 ] && threads=1
      line=$(BODY_BYTES=$body wrk -t"$threads" -c"$conns" -d"${DURATION}s" --latency -s bench/post.lua \
        "http://127.0.0.1:$PORT/v1/queues/bench/messages" | grep RESULT)
      stop_spoold
      result "spoold body=$body conns=$conns fsync=$fsync $line"
    done
  done
done
# The floor under every latency above: the same HTTP stack and load
# generator, with no body and no journal (GET /healthz).
start_spoold floor true
line=$(METHOD=GET wrk -t2 -c64 -d"${DURATION}s" --latency -s bench/post.lua \
  "http://127.0.0.1:$PORT/healthz" | grep RESULT)
stop_spoold
result "floor conns=64 $line"
}

redis_version=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
skip redis || { echo "== Redis LPUSH, appendfsync always (redis-benchmark)" >&2
mkdir -p "$work/redis"
# No background AOF rewrite (it would fork and copy the growing list in the
# middle of a run); no RDB snapshots: the AOF with appendfsync always is
# the durability a user would pick Redis for.
redis-server --port "$REDIS_PORT" --dir "$work/redis" --appendonly yes --appendfsync always \
  --auto-aof-rewrite-percentage 0 --save "" --daemonize no --logfile "$work/redis/log" &
redis_pid=$!
pids+=("$redis_pid")
for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
for body in 1024 16384; do
  for conns in 1 16 64 256; do
    n=$((conns == 1 ? 10000 : 100000))
    threads=$((conns == 1 ? 1 : 2))
    redis-cli -p "$REDIS_PORT" del mylist >/dev/null
    csv=$(redis-benchmark -p "$REDIS_PORT" -t lpush -c "$conns" -d "$body" -n "$n" --threads "$threads" --csv | tail -1)
    # "LPUSH","rps","avg","min","p50","p95","p99","max"
    rps=$(cut -d, -f2 <<<"$csv" | tr -d '"')
    p50=$(cut -d, -f5 <<<"$csv" | tr -d '"')
    p99=$(cut -d, -f7 <<<"$csv" | tr -d '"')
    result "redis body=$body conns=$conns sends_per_s=${rps%.*} p50_us=$(awk "BEGIN{printf \"%d\", $p50*1000}") p99_us=$(awk "BEGIN{printf \"%d\", $p99*1000}")"
  done
done
kill -TERM "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
}

echo "== pull: receive-batch + ack" >&2
# wrk with bench/pull.lua: each wrk thread is one consumer that receives
# batches of 100 and acks every message over its connections. 8 consumers
# with 8 connections each; then the same 64 connections as 2 consumers,
# which leaves the load generator fewer threads to schedule on 2 cores.
for shape in "8 64" "2 64"; do
  read -r consumers conns <<<"$shape"
  start_spoold pull true
  "$load_bin" --url "http://127.0.0.1:$PORT" --queue bench --messages "$PULL_MESSAGES" fill --clients 64 >/dev/null
  line=$(wrk -t"$consumers" -c"$conns" -d"${DURATION}s" -s bench/pull.lua "http://127.0.0.1:$PORT" | grep RESULT)
  stop_spoold
  result "pull consumers=$consumers conns=$conns $line"
done

echo "== push end to end ($TRIALS trials)" >&2
for trial in $(seq 1 "$TRIALS"); do
  "$load_bin" --url "http://127.0.0.1:$PORT" --queue hooks --messages "$PUSH_MESSAGES" push \
    --sink "127.0.0.1:$SINK_PORT" >"$work/push.out" &
  load_pid=$!
  pids+=("$load_pid")
  sleep 0.3
  start_spoold push true
  wait "$load_pid"
  stop_spoold
  result "push trial=$trial $(grep RESULT "$work/push.out")"
done

echo "== replay of $REPLAY_MESSAGES messages; memory and journal bytes per message" >&2
start_spoold replay false
empty_rss=$(rss_kib "$spoold_pid")
"$load_bin" --url "http://127.0.0.1:$PORT" --queue bench --messages "$REPLAY_MESSAGES" fill --clients 64 >/dev/null
stop_spoold
# The fill ran with fsync off: write its pages back now, so that replay
# reads a warm, clean page cache (as after a run with fsync on) instead of
# competing with the kernel's writeback of 1 GB.
sync
dir=$work/replay
# Reopen the same spool (fsync on, as in production), TRIALS times; replay
# time is what spoold logs, records/s follow from it.
sed -i 's/^fsync = false/fsync = true/' "$dir/spoold.toml"
replays=()
for trial in $(seq 1 "$TRIALS"); do
  "$spoold_bin" run --config "$dir/spoold.toml" 2>"$dir/log2" &
  spoold_pid=$!
  pids+=("$spoold_pid")
  for _ in $(seq 1 2400); do curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break; sleep 0.05; done
  sleep 1
  full_rss=$(rss_kib "$spoold_pid")
  open_line=$(grep "spool open" "$dir/log2" | sed 's/\x1b\[[0-9;]*m//g')
  records=$(field records "$open_line")
  messages=$(field messages "$open_line")
  replay_ms=$(field replay_ms "$open_line")
  stop_spoold
  replays+=("trial=$trial records=$records messages=$messages replay_ms=$replay_ms records_per_s=$((records * 1000 / (replay_ms > 0 ? replay_ms : 1))) rss_empty_kib=$empty_rss rss_full_kib=$full_rss rss_bytes_per_msg=$(((full_rss - empty_rss) * 1024 / messages))")
done
journal_bytes=$(python3 - "$dir/spool" <<'PY'
import os, sys
d = sys.argv[1]
segs = sorted(f for f in os.listdir(d) if f.endswith(".seg"))
total = 0
for f in segs:
    total += os.path.getsize(os.path.join(d, f))
# The last segment is preallocated with zeros past its records.
with open(os.path.join(d, segs[-1]), "rb") as fh:
    data = fh.read()
total -= len(data) - len(data.rstrip(b"\0"))
print(total)
PY
)
for r in "${replays[@]}"; do
  result "replay $r journal_bytes_per_msg=$((journal_bytes / messages))"
done
rm -rf "$dir"

echo "== durable sends with a 2 ms fdatasync (strace delay injection)" >&2
for conns in 1 64; do
  start_spoold slowdisk true strace -f -qq -o /dev/null --seccomp-bpf -e trace=fdatasync,fsync \
    -e inject=fdatasync:delay_exit=2000 -e inject=fsync:delay_exit=2000
  threads=$((conns == 1 ? 1 : 2))
  line=$(BODY_BYTES=1024 wrk -t"$threads" -c"$conns" -d"${DURATION}s" --latency -s bench/post.lua \
    "http://127.0.0.1:$PORT/v1/queues/bench/messages" | grep RESULT)
  stop_spoold
  result "slowdisk conns=$conns $line"
done

python3 bench/report.py "$results" "$redis_version"
