#!/usr/bin/env bash
# Durable sends over HTTP: wrk with 64 keep-alive connections posting 1 KiB
# bodies to a release build of spoold, once with fsync on and once off.
# Prints one RESULT line per mode. Load generator and server share the
# machine: compare the two lines of one run, not numbers across runs.
#
#   bench/http_sends.sh            # 10 s per mode
#   DURATION=30s bench/http_sends.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-64}
PORT=${PORT:-18787}

if ! command -v wrk >/dev/null; then
  apt-get update -qq && apt-get install -y -qq wrk >/dev/null
fi
cargo build --release --quiet

work=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

for fsync in true false; do
  dir="$work/spool-$fsync"
  cat > "$work/spoold.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
[spool]
dir = "$dir"
fsync = $fsync
max_bytes = "16GiB"
[log]
level = "warn"
TOML
  target/release/spoold run --config "$work/spoold.toml" &
  pid=$!
  for _ in $(seq 1 200); do
    curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
    sleep 0.05
  done
  curl -fs -X PUT "http://127.0.0.1:$PORT/v1/queues/bench" -H 'Content-Type: application/json' -d '{}' >/dev/null
  echo "== fsync=$fsync: wrk -t2 -c$CONNECTIONS -d$DURATION"
  wrk -t2 -c"$CONNECTIONS" -d"$DURATION" --latency -s bench/post.lua \
    "http://127.0.0.1:$PORT/v1/queues/bench/messages" | grep RESULT | sed "s/^/fsync=$fsync /"
  kill -TERM "$pid"; wait "$pid" || true; pid=""
done
