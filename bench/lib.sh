# Shell helpers shared by bench/run.sh and bench/formats.sh (sourced).
#
# Every spoold a script starts gets a fresh directory under $work, listens
# on $PORT, and is stopped by the script's exit trap.

# install_missing TOOL=PACKAGE...: apt-installs the packages of the tools
# that are not on PATH.
install_missing() {
  local need=() pair
  for pair in "$@"; do
    command -v "${pair%%=*}" >/dev/null || need+=("${pair#*=}")
  done
  if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
}

# write_config DIR FSYNC: DIR/spoold.toml with a pull queue `bench` and a
# push queue `hooks` (destination 127.0.0.1:$SINK_PORT, concurrency 64);
# $EXTRA_CONFIG, if set, heads the file (dotted keys such as
# `delivery.plain_http_client = "pooled"`).
write_config() {
  local dir=$1 fsync=$2
  mkdir -p "$dir"
  cat >"$dir/spoold.toml" <<TOML
${EXTRA_CONFIG:-}
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
destination = "http://127.0.0.1:${SINK_PORT:-9}/in"
concurrency = 64
ordering = "${HOOKS_ORDERING:-none}"
TOML
}

# start_redis PORT DIR: a Redis with `appendonly yes`, `appendfsync always`
# on DIR; sets $redis_pid; waits until it answers. No background AOF rewrite
# (it would fork and copy the growing data in the middle of a run); no RDB
# snapshots: the AOF with appendfsync always is the durability a user would
# pick Redis for.
redis_pid=""
start_redis() {
  local port=$1 dir=$2
  mkdir -p "$dir"
  redis-server --port "$port" --dir "$dir" --appendonly yes --appendfsync always \
    --auto-aof-rewrite-percentage 0 --save "" --daemonize no --logfile "$dir/log" &
  redis_pid=$!
  pids+=("$redis_pid")
  for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
}

# wait_ready PID LOG: until spoold answers /readyz (or the process died).
wait_ready() {
  local pid=$1 log=$2
  for _ in $(seq 1 2400); do
    curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; return 1; }
    sleep 0.05
  done
  echo "spoold never became ready" >&2
  return 1
}

# run_spoold BIN DIR [WRAPPER...]: starts BIN on DIR's config (as it is, a
# spool already there is replayed); sets $spoold_pid; waits until ready.
# The environment of the caller applies (e.g. GLIBC_TUNABLES).
spoold_pid=""
pids=()
run_spoold() {
  local bin=$1 dir=$2; shift 2
  "$@" "$bin" run --config "$dir/spoold.toml" 2>>"$dir/log" &
  spoold_pid=$!
  pids+=("$spoold_pid")
  wait_ready "$spoold_pid" "$dir/log"
}

# stop_spoold: SIGTERM to the spoold of this script (under a wrapper such
# as strace, $spoold_pid is the wrapper, which would only detach).
stop_spoold() {
  pkill -TERM -f -- "--config $work/.*/spoold.toml" 2>/dev/null || true
  wait "$spoold_pid" 2>/dev/null || true
  spoold_pid=""
}

# the_spoold_pid: the pid of spoold itself (not of a wrapper).
the_spoold_pid() { pgrep -f -- "--config $work/.*/spoold.toml" | tail -1; }

rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }

# cpu_ticks PID: user + system CPU time in clock ticks (1/100 s).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# field KEY LINE: the value of KEY=value in LINE (colour codes stripped).
field() {
  sed 's/\x1b\[[0-9;]*m//g' <<<" $2" | sed -n "s/.*[ ^]$1=\([^ ]*\).*/\1/p"
}

# median N...: the lower middle of the numbers.
median() {
  printf '%s\n' "$@" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'
}

# fresh NAME FSYNC: a new spool directory with its config; prints its path.
fresh() {
  local dir=$work/$1
  rm -rf "$dir"
  write_config "$dir" "$2"
  echo "$dir"
}

# push_run BIN MESSAGES [RATE]: a push run on a fresh spool ($load_bin
# forwards MESSAGES to queue `hooks`, whose destination it serves on
# $SINK_PORT; as fast as it can, or RATE a second) until the last arrival;
# the load generator's output is in $work/push.out and spoold
# ($spoold_pid) is left running for the caller to read and stop.
push_run() {
  local bin=$1 messages=$2 rate=${3:-} dir
  dir=$(fresh push true)
  "$load_bin" --url "http://127.0.0.1:$PORT" --queue hooks --messages "$messages" push \
    --sink "127.0.0.1:$SINK_PORT" ${rate:+--rate "$rate"} --ordering-keys "${PUSH_KEYS:-0}" >"$work/push.out" &
  local load_pid=$!
  pids+=("$load_pid")
  sleep 0.3
  run_spoold "$bin" "$dir"
  wait "$load_pid"
}

# push_once BIN [RATE]: one push run of $PUSH_MESSAGES (`push_run`);
# prints the load generator's result and spoold's CPU per message.
push_once() {
  local ticks
  push_run "$1" "$PUSH_MESSAGES" "${2:-}"
  ticks=$(cpu_ticks "$spoold_pid")
  stop_spoold
  echo "$(grep RESULT "$work/push.out" | sed 's/^RESULT //') push_cpu_us_per_msg=$((ticks * 10000 / PUSH_MESSAGES))"
}

kill_all() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}

# push_allocations BIN MESSAGES: one push run of MESSAGES (`push_run`)
# with BIN, a build with feature `count-allocations`; prints the heap
# allocations the process made from its start to the last arrival
# (`spoold_allocations_total`). Two runs of different lengths give the
# allocations per message without the start-up's.
push_allocations() {
  push_run "$1" "$2"
  curl -fs "http://127.0.0.1:$PORT/metrics" | awk '$1 == "spoold_allocations_total" {print $2}'
  stop_spoold
}
