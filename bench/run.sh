#!/usr/bin/env bash
# The performance run, in one go on this machine. Sections (all by default):
#
#   floor     GET /healthz at 64 connections: the HTTP floor every ratio
#             target is measured against (same wrk, same HTTP stack, no body,
#             no journal)
#   sends     spoold's sends over HTTP (wrk) at 1/16/64/256 connections,
#             fsync on and off, 1 KiB and 16 KiB bodies
#   redis     Redis LPUSH with appendfsync always (redis-benchmark), the same
#             concurrency and sizes
#   tail      durable sends at 64 connections beside Redis LPUSH
#             (appendfsync always), 1 KiB, TRIALS trials interleaved: each
#             trial's p99 and rate ratio (the tail target is per trial)
#   pull      receive-batch + ack (wrk, bench/pull.lua)
#   push      push end to end (examples/load.rs push), beside the same load
#             through a bare relay on hyper (examples/relay.rs: no journal,
#             no fsync), the bound of any HTTP-in, HTTP-out design here
#   pushallocs heap allocations per pushed message: a build with feature
#             count-allocations (one more release build), two push runs
#             of 10 000 and 40 000 messages, the difference per message
#   bullmq    BullMQ on Redis (appendfsync always) with a worker posting to
#             a destination (bench/bullmq/push.mjs, bullmq from npm), beside
#             spoold's push in the same trials
#   replay    replay of a 1 M-message spool, resident memory and journal
#             bytes per message
#   slowdisk  durable sends with every fdatasync delayed by 2 ms (strace)
#   cluster   durable sends of a 3-replica cluster (three processes and
#             spool directories on this one machine) at 64 connections to
#             the primary, beside a single node's in the same trials, with
#             CPU per message on each replica
#   catchup   catch-up by snapshot: a follower of a 3-replica cluster is
#             down while wrk sends for DURATION × 4 seconds (every message
#             kept), the primary purges its log, the follower comes back
#             and receives the checkpoint streamed: time, bytes, and the
#             follower's peak memory beside the snapshot's size
#   endpoints webhooks to many customers: ENDPOINT_QUEUES (100 000) push
#             queues created over the API, spoold's memory per queue and its
#             CPU while they idle; one event to 1 000 of them (time to its
#             202: every delivery enqueued), one event to 10 000 of them
#             (time until each was delivered). With ENDPOINTS_BEFORE=path
#             to an older spoold, that build's memory per queue and idle CPU
#             too (ENDPOINTS_BEFORE_QUEUES of them, 10 000: it spends
#             about 100 KiB each)
#   search    issue 38's bounds (bench/search.py): SEARCHERS (8) threads
#             asking the worst search pages there are over 200 bodies of
#             1 MiB, beside /healthz p50/p99 alone and meanwhile; then 300
#             events to 10 000 subscribers, RSS per delivery beside the
#             memory account
#   filters   the cost of content filters (bench/filters.py): 100 pull
#             queues subscribed to `order.>`, 3 000 events one after
#             another, with no filter, with a filter on each that every
#             event passes, and with filters that half the queues pass
#   ordering  ordered delivery's cost: push as the push section runs it,
#             on an unordered queue, then on one with ordering = "per_key"
#             and 10 000 keys, then 64 keys (the queue's concurrency)
#   svix      webhook fan-out beside Svix's server on PostgreSQL and Redis
#             (bench/svix.sh, examples/fanout.rs): needs SVIX_BIN; at
#             100, 1 000 and 10 000 endpoints, each system at its most and
#             at half of it: events/s, deliveries/s, p50/p99 publish to
#             arrival, CPU, PSS and bytes written per delivery
#   tenants   a tenant-scoped key beside an operator's (admin) key, trials
#             interleaved: durable sends to a tenant's paused push queue and
#             GET of it, wrk at 64 connections, among 1 000 tenants' queues
#   alloc     the allocators side by side: jemalloc (the default), glibc,
#             glibc with a larger tcache and heap top pad, mimalloc (two more
#             release builds)
#
# Every section but `alloc` measures the default build (jemalloc).
#
# Load generators and servers share the two cores: compare the figures of
# one run with each other, not across runs. Each section's result lines
# replace that section's lines in bench/results.txt (the others are kept,
# with the date they were measured); bench/report.py then writes the tables
# into docs/performance.md (between the bench:run.sh markers) and prints
# them.
#
#   bench/run.sh                       # about 15 minutes
#   SKIP="sends redis" bench/run.sh    # every section but those
#   ONLY="floor push" bench/run.sh     # only those
#   DURATION=10 bench/run.sh           # seconds per wrk run (default 5)
#   TRIALS=5 bench/run.sh              # trials of push, replay, alloc (3)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. bench/lib.sh
DURATION=${DURATION:-5}
REPLAY_MESSAGES=${REPLAY_MESSAGES:-1000000}
PULL_MESSAGES=${PULL_MESSAGES:-200000}   # enough for DURATION seconds
PUSH_MESSAGES=${PUSH_MESSAGES:-50000}
ALLOC_MESSAGES=${ALLOC_MESSAGES:-500000}
# Push (about 3 s) and replay (about 1 s) are shorter than one wrk run, and
# a moment of the shared machine's slowness decides a single one: each is
# measured this many times and the median reported (all are printed).
TRIALS=${TRIALS:-3}
PORT=${PORT:-18787}
REDIS_PORT=${REDIS_PORT:-18788}
SINK_PORT=${SINK_PORT:-18789}
BULLMQ_REDIS_PORT=${BULLMQ_REDIS_PORT:-18790}
SKIP=${SKIP:-}
# `svix` runs only when SVIX_BIN names a built svix-server.
ONLY=${ONLY:-floor sends redis tail pull push pushallocs bullmq replay slowdisk cluster catchup jetstream endpoints search filters ordering tenants ${SVIX_BIN:+svix} alloc}
ENDPOINT_QUEUES=${ENDPOINT_QUEUES:-100000}
ENDPOINTS_BEFORE=${ENDPOINTS_BEFORE:-}
ENDPOINTS_BEFORE_QUEUES=${ENDPOINTS_BEFORE_QUEUES:-10000}
run_section() { [[ " $ONLY " == *" $1 "* && " $SKIP " != *" $1 "* ]]; }

install_missing wrk=wrk redis-server=redis-server redis-benchmark=redis-tools strace=strace curl=curl

work=$(mktemp -d "$root/target/bench.XXXXXX")
trap 'kill_all; rm -rf "$work"' EXIT
echo "== building (release)" >&2
cargo build --release --quiet --bin spoold --example load --example jetstream_load --example relay
mkdir -p "$work/bin"
cp target/release/spoold "$work/bin/spoold"
cp target/release/examples/load "$work/bin/load"
cp target/release/examples/jetstream_load "$work/bin/jetstream_load"
cp target/release/examples/relay "$work/bin/relay"
spoold_bin=$work/bin/spoold
load_bin=$work/bin/load

run_id=$(date -u +%Y-%m-%dT%H:%M)
new=$work/results.txt
: >"$new"
result() { echo "$* date=${run_id%T*} run=$run_id" | tee -a "$new" >&2; }

run_section floor && { echo "== the HTTP floor: GET /healthz at 64 connections" >&2
  dir=$(fresh floor true)
  run_spoold "$spoold_bin" "$dir"
  line=$(METHOD=GET wrk -t2 -c64 -d"${DURATION}s" --latency -s bench/post.lua \
    "http://127.0.0.1:$PORT/healthz" | grep RESULT)
  stop_spoold
  result "floor conns=64 $line"
}

run_section sends && { echo "== spoold sends over HTTP (wrk, ${DURATION}s each)" >&2
  for body in 1024 16384; do
    for conns in 1 16 64 256; do
      for fsync in true false; do
        dir=$(fresh "sends-$fsync" "$fsync")
        run_spoold "$spoold_bin" "$dir"
        threads=2; [ "$conns" -eq 1 ] && threads=1
        line=$(BODY_BYTES=$body wrk -t"$threads" -c"$conns" -d"${DURATION}s" --latency -s bench/post.lua \
          "http://127.0.0.1:$PORT/v1/queues/bench/messages" | grep RESULT)
        stop_spoold
        result "sends body=$body conns=$conns fsync=$fsync $line"
      done
    done
  done
}

# redis_lpush CONNS BODY N THREADS: one redis-benchmark LPUSH run on the
# Redis at $REDIS_PORT; prints sends_per_s, p50_us and p99_us.
redis_lpush() {
  local csv rps p50 p99
  redis-cli -p "$REDIS_PORT" del mylist >/dev/null
  csv=$(redis-benchmark -p "$REDIS_PORT" -t lpush -c "$1" -d "$2" -n "$3" --threads "$4" --csv | tail -1)
  # "LPUSH","rps","avg","min","p50","p95","p99","max"
  rps=$(cut -d, -f2 <<<"$csv" | tr -d '"')
  p50=$(cut -d, -f5 <<<"$csv" | tr -d '"')
  p99=$(cut -d, -f7 <<<"$csv" | tr -d '"')
  echo "sends_per_s=${rps%.*} p50_us=$(awk "BEGIN{printf \"%d\", $p50*1000}") p99_us=$(awk "BEGIN{printf \"%d\", $p99*1000}")"
}

run_section redis && { echo "== Redis LPUSH, appendfsync always (redis-benchmark)" >&2
  redis_version=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
  start_redis "$REDIS_PORT" "$work/redis"
  for body in 1024 16384; do
    for conns in 1 16 64 256; do
      n=$((conns == 1 ? 10000 : 100000))
      threads=$((conns == 1 ? 1 : 2))
      result "redis body=$body conns=$conns $(redis_lpush "$conns" "$body" "$n" "$threads") version=$redis_version"
    done
  done
  kill -TERM "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
}

run_section tail && { echo "== the sends' tail: spoold and Redis at 64 connections ($TRIALS trials, interleaved)" >&2
  start_redis "$REDIS_PORT" "$work/redis-tail"
  for trial in $(seq 1 "$TRIALS"); do
    dir=$(fresh tail true)
    run_spoold "$spoold_bin" "$dir"
    line=$(BODY_BYTES=1024 wrk -t2 -c64 -d"${DURATION}s" --latency -s bench/post.lua \
      "http://127.0.0.1:$PORT/v1/queues/bench/messages" | grep RESULT)
    stop_spoold
    result "tail system=spoold trial=$trial $line"
    result "tail system=redis trial=$trial $(redis_lpush 64 1024 100000 2)"
  done
  kill -TERM "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
}

run_section pull && { echo "== pull: receive-batch + ack" >&2
  # wrk with bench/pull.lua: each wrk thread is one consumer that receives
  # batches of 100 and acks every message over its connections. 8
  # consumers with 8 connections each; then the same 64 connections as 2
  # consumers, which leaves the load generator fewer threads to schedule.
  for shape in "8 64" "2 64"; do
    read -r consumers conns <<<"$shape"
    dir=$(fresh pull true)
    run_spoold "$spoold_bin" "$dir"
    "$load_bin" --url "http://127.0.0.1:$PORT" --queue bench --messages "$PULL_MESSAGES" fill --clients 64 >/dev/null
    line=$(wrk -t"$consumers" -c"$conns" -d"${DURATION}s" -s bench/pull.lua "http://127.0.0.1:$PORT" | grep RESULT)
    stop_spoold
    result "pull consumers=$consumers conns=$conns $line"
  done
}

# most_then_half MOST HALF KEY SUFFIX CMD...: runs CMD as fast as it goes
# and reports "MOST LINE SUFFIX"; then CMD RATE, open loop at half the KEY
# it reached, reported as "HALF rate=RATE LINE SUFFIX".
most_then_half() {
  local most=$1 half=$2 key=$3 suffix=$4 line rate
  shift 4
  line=$("$@")
  result "$most $line${suffix:+ $suffix}"
  rate=$(($(field "$key" "$line") / 2))
  result "$half rate=$rate $("$@" "$rate")${suffix:+ $suffix}"
}

# relay_once: the push load through examples/relay.rs instead of spoold
# (a forward answered 202 once in memory, posted to the destination by 64
# workers: hyper's cost alone); prints the load generator's result and the
# relay's CPU per message.
relay_once() {
  local out=$work/relay.out load_pid relay_pid ticks
  "$load_bin" --url "http://127.0.0.1:$PORT" --queue hooks --messages "$PUSH_MESSAGES" push \
    --sink "127.0.0.1:$SINK_PORT" >"$out" &
  load_pid=$!
  pids+=("$load_pid")
  sleep 0.3
  "$work/bin/relay" --listen "127.0.0.1:$PORT" --sink "127.0.0.1:$SINK_PORT" &
  relay_pid=$!
  pids+=("$relay_pid")
  wait "$load_pid"
  ticks=$(cpu_ticks "$relay_pid")
  kill -TERM "$relay_pid"
  wait "$relay_pid" 2>/dev/null || true
  echo "$(grep RESULT "$out" | sed 's/^RESULT //') push_cpu_us_per_msg=$((ticks * 10000 / PUSH_MESSAGES))"
}

# Push is measured twice a trial: as fast as it goes (delivered/s, CPU per
# message), then at half that rate, open loop, for its latency; then the
# same load through the bare relay, as fast as it goes.
run_section push && { echo "== push end to end ($TRIALS trials)" >&2
  for trial in $(seq 1 "$TRIALS"); do
    most_then_half "push trial=$trial" "pushhalf trial=$trial" push_delivered_per_s "" \
      push_once "$spoold_bin"
    result "relay trial=$trial $(relay_once)"
  done
}

# bullmq_once [RATE]: the push measurement done by BullMQ 5 on a fresh Redis with
# `appendonly yes`, `appendfsync always`: bench/bullmq/push.mjs's producer
# (the application and the destination, like examples/load.rs push) adds
# $PUSH_MESSAGES jobs of 1 KiB from 64 loops, its worker (concurrency 64)
# posts each job to the destination (as fast as it goes, or RATE jobs a
# second). Prints the producer's result, and the
# CPU per message of Redis and of the worker (counted from the moment the
# worker is ready, so Node's start-up is left out), and of both.
bullmq_once() {
  local rate=${1:-} dir=$work/bullmq redis_pid worker_pid redis0 worker0 redis_ticks worker_ticks line
  rm -rf "$dir"
  start_redis "$BULLMQ_REDIS_PORT" "$dir"
  node bench/bullmq/push.mjs worker --redis "$BULLMQ_REDIS_PORT" --sink "$SINK_PORT" &
  worker_pid=$!
  pids+=("$worker_pid")
  sleep 1
  redis0=$(cpu_ticks "$redis_pid")
  worker0=$(cpu_ticks "$worker_pid")
  line=$(node bench/bullmq/push.mjs producer --redis "$BULLMQ_REDIS_PORT" --sink "$SINK_PORT" \
    --messages "$PUSH_MESSAGES" ${rate:+--rate "$rate"} | grep RESULT | sed 's/^RESULT //')
  redis_ticks=$(($(cpu_ticks "$redis_pid") - redis0))
  worker_ticks=$(($(cpu_ticks "$worker_pid") - worker0))
  kill -TERM "$worker_pid"
  wait "$worker_pid" 2>/dev/null || true
  redis-cli -p "$BULLMQ_REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  wait "$redis_pid" 2>/dev/null || true
  echo "$line bullmq_redis_cpu_us_per_msg=$((redis_ticks * 10000 / PUSH_MESSAGES))" \
    "bullmq_worker_cpu_us_per_msg=$((worker_ticks * 10000 / PUSH_MESSAGES))" \
    "bullmq_cpu_us_per_msg=$(((redis_ticks + worker_ticks) * 10000 / PUSH_MESSAGES))"
}

run_section pushallocs && { echo "== heap allocations per pushed message (feature count-allocations)" >&2
  cargo build --release --quiet --bin spoold --features count-allocations
  cp target/release/spoold "$work/bin/spoold-counting"
  # Put the default build back where a user expects it.
  cargo build --release --quiet --bin spoold
  short=$(push_allocations "$work/bin/spoold-counting" 10000)
  long=$(push_allocations "$work/bin/spoold-counting" 40000)
  result "pushallocs messages=30000 allocations=$((long - short))"
}

run_section bullmq && { echo "== BullMQ on Redis (appendfsync always) beside spoold's push ($TRIALS trials)" >&2
  command -v node >/dev/null && command -v npm >/dev/null || { echo "bullmq needs node and npm" >&2; exit 1; }
  (cd bench/bullmq && npm ci --silent --no-audit --no-fund)
  bullmq_version=$(node -p 'require("./bench/bullmq/node_modules/bullmq/package.json").version')
  redis_version=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
  versions="bullmq=$bullmq_version redis=$redis_version node=$(node --version)"
  # Each at its own most, then each at half of it (open loop) for latency:
  # at its most, BullMQ takes jobs faster than it delivers them, and its
  # latency is the backlog's.
  for trial in $(seq 1 "$TRIALS"); do
    most_then_half "bullmq system=bullmq load=max trial=$trial" \
      "bullmq system=bullmq load=half trial=$trial" bullmq_delivered_per_s "$versions" bullmq_once
    most_then_half "bullmq system=spoold load=max trial=$trial" \
      "bullmq system=spoold load=half trial=$trial" push_delivered_per_s "" push_once "$spoold_bin"
  done
}

# endpoints_once BIN QUEUES [plain]: the endpoints measurement on a fresh
# spool (fsync on); prints the load generator's result.
endpoints_once() {
  local bin=$1 queues=$2 plain=${3:-} dir out
  dir=$(fresh endpoints true)
  run_spoold "$bin" "$dir"
  out=$work/endpoints.out
  "$load_bin" --url "http://127.0.0.1:$PORT" endpoints --pid "$spoold_pid" --queues "$queues" \
    --sink "127.0.0.1:$SINK_PORT" ${plain:+--plain} >"$out"
  stop_spoold
  grep RESULT "$out" | sed 's/^RESULT //'
}

run_section endpoints && { echo "== endpoints: $ENDPOINT_QUEUES push queues" >&2
  result "endpoints build=this $(endpoints_once "$spoold_bin" "$ENDPOINT_QUEUES")"
  if [[ -n $ENDPOINTS_BEFORE ]]; then
    result "endpoints build=before $(endpoints_once "$ENDPOINTS_BEFORE" "$ENDPOINTS_BEFORE_QUEUES" plain)"
  fi
}

# fill_and_replay BIN MESSAGES: fills a fresh spool (fsync off), then
# reopens it (fsync on, as in production); prints the empty and full RSS
# and what spoold logged of the replay.
fill_and_replay() {
  local bin=$1 messages=$2 dir empty full line
  dir=$(fresh replay false)
  run_spoold "$bin" "$dir"
  empty=$(rss_kib "$spoold_pid")
  "$load_bin" --url "http://127.0.0.1:$PORT" --queue bench --messages "$messages" fill --clients 64 >/dev/null
  stop_spoold
  # The fill ran with fsync off: write its pages back now, so that replay
  # reads a warm, clean page cache instead of competing with writeback.
  sync
  sed -i 's/^fsync = false/fsync = true/' "$dir/spoold.toml"
  : >"$dir/log"
  run_spoold "$bin" "$dir"
  sleep 1
  full=$(rss_kib "$spoold_pid")
  line=$(grep "spool open" "$dir/log")
  stop_spoold
  echo "records=$(field records "$line") messages=$(field messages "$line") replay_ms=$(field replay_ms "$line") rss_empty_kib=$empty rss_full_kib=$full"
}

run_section replay && { echo "== replay of $REPLAY_MESSAGES messages; memory and journal bytes per message" >&2
  for trial in $(seq 1 "$TRIALS"); do
    line=$(fill_and_replay "$spoold_bin" "$REPLAY_MESSAGES")
    journal_bytes=$(python3 - "$work/replay/spool" <<'PY'
import os, sys
d = sys.argv[1]
names = [f for f in os.listdir(d) if f.endswith((".seg", ".pack", ".ckpt"))]
total = sum(os.path.getsize(os.path.join(d, f)) for f in names)
# The last segment is preallocated with zeros past its records.
last = max(f for f in names if f.endswith(".seg"))
with open(os.path.join(d, last), "rb") as fh:
    data = fh.read()
print(total - (len(data) - len(data.rstrip(b"\0"))))
PY
)
    messages=$(field messages "$line")
    result "replay trial=$trial $line journal_bytes_per_msg=$((journal_bytes / messages))"
  done
}

run_section slowdisk && { echo "== durable sends with a 2 ms fdatasync (strace delay injection)" >&2
  for conns in 1 64; do
    dir=$(fresh slowdisk true)
    run_spoold "$spoold_bin" "$dir" strace -f -qq -o /dev/null --seccomp-bpf -e trace=fdatasync,fsync \
      -e inject=fdatasync:delay_exit=2000 -e inject=fsync:delay_exit=2000
    threads=$((conns == 1 ? 1 : 2))
    line=$(BODY_BYTES=1024 wrk -t"$threads" -c"$conns" -d"${DURATION}s" --latency -s bench/post.lua \
      "http://127.0.0.1:$PORT/v1/queues/bench/messages" | grep RESULT)
    stop_spoold
    result "slowdisk conns=$conns $line"
  done
}

# start_cluster [SPOOL_TOML]: writes and starts three replicas in
# $work/cluster-{1,2,3} (SPOOL_TOML added to each [spool] table); sets
# pids_c (their pids) and primary (its API URL) once it serves.
start_cluster() {
  local extra=${1:-} i dir peers=""
  pids_c=()
  primary=""
  for i in 1 2 3; do peers+="$i = \"127.0.0.1:$((PORT + 200 + i))\", "; done
  for i in 1 2 3; do
    dir=$work/cluster-$i
    rm -rf "$dir"
    write_config "$dir" true
    sed -i "s/^listen = .*/listen = \"127.0.0.1:$((PORT + 100 + i))\"/" "$dir/spoold.toml"
    [ -n "$extra" ] && sed -i "s|^\[spool\]|[spool]\n$extra|" "$dir/spoold.toml"
    cat >>"$dir/spoold.toml" <<TOML
[cluster]
node_id = $i
listen = "127.0.0.1:$((PORT + 200 + i))"
api_url = "http://127.0.0.1:$((PORT + 100 + i))"
secret = "a bench secret of some length"
peers = { ${peers%, } }
TOML
    "$spoold_bin" run --config "$dir/spoold.toml" 2>>"$dir/log" &
    pids_c+=("$!")
    pids+=("$!")
  done
  for _ in $(seq 1 200); do
    primary=$(cluster_json 1 'p["primary"]["apiUrl"] or ""')
    [ -n "$primary" ] && curl -fs "$primary/v1/queues/bench" >/dev/null 2>&1 && return 0
    primary=""
    sleep 0.1
  done
  echo "the cluster elected no primary" >&2
  tail -20 "$work"/cluster-*/log >&2
  return 1
}

# cluster_json I EXPR: EXPR of replica I's GET /v1/cluster (as `p`).
cluster_json() {
  curl -fs "http://127.0.0.1:$((PORT + 100 + $1))/v1/cluster" 2>/dev/null \
    | python3 -c "import json,sys; p=json.load(sys.stdin); print($2)" 2>/dev/null || true
}

stop_cluster() {
  local i
  for i in 0 1 2; do kill -TERM "${pids_c[$i]}" 2>/dev/null || true; done
  for i in 0 1 2; do wait "${pids_c[$i]}" 2>/dev/null || true; done
}

# cluster_once TRIAL: one trial of a 3-replica cluster: starts it, finds the
# primary, runs wrk against it, and reports with each replica's CPU per
# acknowledged message.
cluster_once() {
  local trial=$1 i ticks0=() line
  start_cluster
  for i in 0 1 2; do ticks0+=("$(cpu_ticks "${pids_c[$i]}")"); done
  line=$(BODY_BYTES=1024 wrk -t2 -c64 -d"${DURATION}s" --latency -s bench/post.lua \
    "$primary/v1/queues/bench/messages" | grep RESULT)
  local requests cpu=""
  requests=$(field requests "$line")
  for i in 0 1 2; do
    cpu+=" cpu_us_per_msg_$((i + 1))=$(( ($(cpu_ticks "${pids_c[$i]}") - ${ticks0[$i]}) * 10000 / (requests > 0 ? requests : 1) ))"
  done
  stop_cluster
  result "cluster replicas=3 trial=$trial primary=${primary##*:} $line$cpu"
}

# catchup_once TRIAL: a follower down while the others take messages and
# purge their log; then the time until it has applied everything, the
# snapshot's bytes, and its peak resident memory.
catchup_once() {
  local trial=$1 f i line requests commit t0 t1 bytes rss prss
  start_cluster 'compaction_interval = "200ms"'
  for i in 1 2 3; do
    [ "$primary" != "http://127.0.0.1:$((PORT + 100 + i))" ] && { f=$i; break; }
  done
  kill -KILL "${pids_c[$((f - 1))]}"
  wait "${pids_c[$((f - 1))]}" 2>/dev/null || true
  line=$(BODY_BYTES=1024 wrk -t2 -c64 -d"$((DURATION * 4))s" -s bench/post.lua \
    "$primary/v1/queues/bench/messages" | grep RESULT)
  requests=$(field requests "$line")
  local p=$(( ${primary##*:} - PORT - 100 ))
  for _ in $(seq 1 300); do
    [ "$(cluster_json "$p" '(p["purgedIndex"] or 0) > 1000')" = True ] && break
    sleep 0.1
  done
  commit=$(cluster_json "$p" 'p["commitIndex"]')
  t0=$(date +%s.%N)
  "$spoold_bin" run --config "$work/cluster-$f/spoold.toml" 2>>"$work/cluster-$f/log" &
  pids_c[$((f - 1))]=$!
  pids+=("$!")
  for _ in $(seq 1 6000); do
    [ "$(cluster_json "$f" "(p['appliedIndex'] or 0) >= $commit")" = True ] && break
    sleep 0.05
  done
  t1=$(date +%s.%N)
  rss=$(awk '/VmHWM/ {print $2}' "/proc/${pids_c[$((f - 1))]}/status")
  prss=$(awk '/VmHWM/ {print $2}' "/proc/${pids_c[$((p - 1))]}/status")
  bytes=$(grep -o 'received a snapshot.*' "$work/cluster-$f/log" | grep -o 'bytes=[0-9]*' | tail -1 | cut -d= -f2)
  stop_cluster
  result "catchup trial=$trial messages=$requests snapshot_bytes=${bytes:-0} seconds=$(python3 -c "print(round($t1 - $t0, 2))") follower_peak_rss_kib=$rss primary_peak_rss_kib=$prss"
}

run_section cluster && { echo "== a 3-replica cluster beside a single node: durable sends, 64 connections ($TRIALS trials)" >&2
  for trial in $(seq 1 "$TRIALS"); do
    dir=$(fresh single true)
    run_spoold "$spoold_bin" "$dir"
    ticks=$(cpu_ticks "$spoold_pid")
    line=$(BODY_BYTES=1024 wrk -t2 -c64 -d"${DURATION}s" --latency -s bench/post.lua \
      "http://127.0.0.1:$PORT/v1/queues/bench/messages" | grep RESULT)
    ticks=$(( $(cpu_ticks "$spoold_pid") - ticks ))
    stop_spoold
    result "cluster replicas=1 trial=$trial $line cpu_us_per_msg_1=$(( ticks * 10000 / $(field requests "$line") ))"
    cluster_once "$trial"
  done
}

# fsyncs I: the fsyncs (group commits) replica I has done, from its metrics.
fsyncs() {
  curl -fs "http://127.0.0.1:$((PORT + 100 + $1))/metrics" \
    | awk '/^spoold_journal_fsync_duration_seconds_count/ {s += $2} END {printf "%d", s}'
}

# jetstream_once TRIAL: NATS JetStream R3 (three local nats-server, file
# storage, routes between them) beside spoold's 3-replica cluster, same
# 1 KiB bodies, 64 clients waiting for their ack.
jetstream_once() {
  local trial=$1 i dir line before after pid calls n nats_version
  nats_version=$(nats-server --version | sed 's/.* v//')
  for i in 1 2 3; do
    dir=$work/nats-$i
    rm -rf "$dir"; mkdir -p "$dir"
    local routes=""
    for j in 1 2 3; do [ "$j" != "$i" ] && routes+="nats://127.0.0.1:$((PORT + 400 + j)), "; done
    cat >"$dir/nats.conf" <<CONF
server_name: n$i
listen: 127.0.0.1:$((PORT + 300 + i))
jetstream { store_dir: "$dir/js", max_file_store: 20GB }
cluster { name: bench, listen: 127.0.0.1:$((PORT + 400 + i)), routes: [ ${routes%, } ] }
CONF
    nats-server -c "$dir/nats.conf" >>"$dir/log" 2>&1 &
    pids_n[$i]=$!
    pids+=("$!")
  done
  for i in 1 2 3; do
    for _ in $(seq 1 100); do
      (echo >"/dev/tcp/127.0.0.1/$((PORT + 300 + i))") 2>/dev/null && break
      sleep 0.1
    done
  done
  local servers="127.0.0.1:$((PORT + 301)),127.0.0.1:$((PORT + 302)),127.0.0.1:$((PORT + 303))"
  "$work/bin/jetstream_load" --servers "$servers" --create-stream BENCH --subject bench.x --seconds 1 >/dev/null
  line=$("$work/bin/jetstream_load" --servers "$servers" --subject bench.x --clients 64 --seconds "$DURATION" | grep RESULT)
  # What a server fsyncs per acknowledged message: strace counts
  # server 1's fsync/fdatasync calls (all threads) during a second, shorter run.
  pid=${pids_n[1]}
  timeout 8 strace -f -c -e trace=fsync,fdatasync -p "$pid" -o "$work/nats-strace" &
  local tracer=$!
  sleep 1
  n=$("$work/bin/jetstream_load" --servers "$servers" --subject bench.x --clients 64 --seconds 5 | grep -o 'requests=[0-9]*' | cut -d= -f2)
  wait "$tracer" 2>/dev/null || true
  calls=$(awk '$NF == "fsync" || $NF == "fdatasync" {s += $4} END {printf "%d", s}' "$work/nats-strace")
  for i in 1 2 3; do kill -TERM "${pids_n[$i]}" 2>/dev/null || true; wait "${pids_n[$i]}" 2>/dev/null || true; done
  result "jetstream system=nats-jetstream-r3 trial=$trial $line fsyncs_per_msg=$(python3 -c "print(round($calls / max($n, 1), 4))") version=$nats_version"

  start_cluster
  before=$(( $(fsyncs 1) + $(fsyncs 2) + $(fsyncs 3) ))
  line=$(BODY_BYTES=1024 wrk -t2 -c64 -d"${DURATION}s" --latency -s bench/post.lua \
    "$primary/v1/queues/bench/messages" | grep RESULT)
  after=$(( $(fsyncs 1) + $(fsyncs 2) + $(fsyncs 3) ))
  stop_cluster
  result "jetstream system=spoold-r3 trial=$trial $line fsyncs_per_msg=$(python3 -c "print(round(($after - $before) / 3 / max($(field requests "$line"), 1), 4))")"
}

run_section jetstream && { echo "== NATS JetStream R3 beside spoold's 3-replica cluster ($TRIALS trials)" >&2
  install_missing nats-server=nats-server
  for trial in $(seq 1 "$TRIALS"); do jetstream_once "$trial"; done
}

run_section catchup && { echo "== catch-up by snapshot ($TRIALS trials)" >&2
  for trial in $(seq 1 "$TRIALS"); do catchup_once "$trial"; done
}

run_section search && { echo "== search pages beside /healthz; fan-out memory per delivery" >&2
  python3 bench/search.py "$spoold_bin" | grep RESULT | sed 's/^RESULT //' | while read -r line; do
    result "$line"
  done
}

run_section filters && { echo "== content filters beside the same fan-out without them" >&2
  python3 bench/filters.py "$spoold_bin" | grep RESULT | sed 's/^RESULT //' | while read -r line; do
    result "$line"
  done
}

run_section ordering && { echo "== ordered push beside unordered ($TRIALS trials, interleaved)" >&2
  for trial in $(seq 1 "$TRIALS"); do
    for shape in "none 0" "per_key 10000" "per_key 64"; do
      read -r ordering keys <<<"$shape"
      line=$(HOOKS_ORDERING=$ordering PUSH_KEYS=$keys push_once "$spoold_bin")
      result "ordering trial=$trial ordering=$ordering keys=$keys $line"
    done
  done
}

# tenants_once: one spool with an operator's key and a tenant's key
# (tenant t7, queues t7-*), 1 000 tenants' push queues (paused, so that
# nothing is delivered); each key sends to and reads t7-hooks in turn.
tenants_once() {
  local trial=$1 dir key line
  dir=$(fresh tenants true)
  sed -i '/^\[server\]/a api_keys = ["bench-operator-key", { key = "bench-tenant-key", tenant = "t7", queues = ["t7-*"] }]' "$dir/spoold.toml"
  run_spoold "$spoold_bin" "$dir"
  for i in $(seq 0 999); do
    curl -fs -X PUT -H "Authorization: Bearer bench-operator-key" -H "Content-Type: application/json" \
      -d "{\"destination\": \"http://127.0.0.1:9/\", \"tenant\": \"t$i\"}" \
      "http://127.0.0.1:$PORT/v1/queues/t$i-hooks" >/dev/null
    curl -fs -X POST -H "Authorization: Bearer bench-operator-key" "http://127.0.0.1:$PORT/v1/queues/t$i-hooks/pause" >/dev/null
  done
  local order="operator tenant"
  [ $((trial % 2)) = 0 ] && order="tenant operator"
  for key in $order; do
    line=$(API_KEY=bench-$key-key BODY_BYTES=1024 wrk -t2 -c64 -d"${DURATION}s" --latency -s bench/post.lua \
      "http://127.0.0.1:$PORT/v1/queues/t7-hooks/messages" | grep RESULT)
    result "tenants trial=$trial key=$key request=send ${line#RESULT }"
    line=$(API_KEY=bench-$key-key METHOD=GET wrk -t2 -c64 -d"${DURATION}s" --latency -s bench/post.lua \
      "http://127.0.0.1:$PORT/v1/queues/t7-hooks" | grep RESULT)
    result "tenants trial=$trial key=$key request=get ${line#RESULT }"
  done
  stop_spoold
}

run_section tenants && { echo "== a tenant's key beside an operator's ($TRIALS trials)" >&2
  for trial in $(seq 1 "$TRIALS"); do tenants_once "$trial"; done
}

run_section svix && { echo "== webhook fan-out beside Svix's server" >&2
  . bench/svix.sh
  svix_section
}

run_section alloc && { echo "== allocators side by side ($TRIALS trials, interleaved)" >&2
  for build in "glibc --no-default-features" "mimalloc --features mimalloc"; do
    read -r name flags <<<"$build"
    echo "== building (release, $flags)" >&2
    # shellcheck disable=SC2086
    cargo build --release --quiet --bin spoold $flags
    cp target/release/spoold "$work/bin/spoold-$name"
  done
  # Put the default build back where a user expects it.
  cargo build --release --quiet --bin spoold
  # glibc's tcache at 1 000 chunks of each size and a 16 MiB heap top pad:
  # what spoold once set by re-executing itself.
  tuned="glibc.malloc.tcache_count=1000:glibc.malloc.top_pad=16777216"
  for trial in $(seq 1 "$TRIALS"); do
    for variant in jemalloc glibc glibc-tuned mimalloc; do
      case $variant in
        jemalloc) bin=$spoold_bin ;;
        glibc-tuned) bin=$work/bin/spoold-glibc ;;
        *) bin=$work/bin/spoold-$variant ;;
      esac
      if [ "$variant" = glibc-tuned ]; then export GLIBC_TUNABLES=$tuned; else unset GLIBC_TUNABLES; fi
      dir=$(fresh alloc true)
      run_spoold "$bin" "$dir"
      sends=$(BODY_BYTES=1024 wrk -t2 -c64 -d"${DURATION}s" --latency -s bench/post.lua \
        "http://127.0.0.1:$PORT/v1/queues/bench/messages" | grep RESULT)
      stop_spoold
      push=$(push_once "$bin")
      memory=$(fill_and_replay "$bin" "$ALLOC_MESSAGES")
      result "alloc variant=$variant trial=$trial sends_per_s=$(field sends_per_s "$sends") push_cpu_us_per_msg=$(field push_cpu_us_per_msg "$push") push_delivered_per_s=$(field push_delivered_per_s "$push") $memory"
    done
  done
  unset GLIBC_TUNABLES
}

# Merge: this run's sections replace theirs in bench/results.txt.
python3 - "$new" bench/results.txt <<'PY'
import sys
new = [l for l in open(sys.argv[1]) if l.strip()]
try:
    old = [l for l in open(sys.argv[2]) if l.strip()]
except FileNotFoundError:
    old = []
measured = {l.split()[0] for l in new}
kept = [l for l in old if l.split()[0] not in measured]
open(sys.argv[2], "w").writelines(kept + new)
PY
python3 bench/report.py bench/results.txt
