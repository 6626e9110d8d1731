#!/usr/bin/env bash
# Journal format 2 (checkpoints) against format 1, side by side in one run:
# durable sends/s at 64 connections (wrk, 1 KiB, fsync on), replay of a
# 1 M-message spool and resident memory per queued message, with the two
# binaries interleaved trial by trial; then, format 2 only, replay of a spool
# whose checkpoint holds the 1 M live messages (after `spoold journal
# compact`) and of one with 1 M records after a (small) checkpoint.
#
#   OLD_BIN=/path/to/format-1/spoold bench/formats.sh
#   TRIALS=3 DURATION=5 REPLAY_MESSAGES=1000000 OLD_BIN=… bench/formats.sh
#
# OLD_BIN is a release build of the last format-1 commit (73c2ac8), e.g.
#   git worktree add /tmp/f1 73c2ac8 && (cd /tmp/f1 && cargo build --release)
# Prints result lines; docs/performance.md keeps the table of the last run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
: "${OLD_BIN:?set OLD_BIN to a release build of the format-1 spoold}"
DURATION=${DURATION:-5}
TRIALS=${TRIALS:-3}
REPLAY_MESSAGES=${REPLAY_MESSAGES:-1000000}
PORT=${PORT:-18797}

. bench/lib.sh
install_missing wrk=wrk curl=curl
echo "== building (release)" >&2
cargo build --release --quiet --bin spoold --example load
new_bin=$root/target/release/spoold
load_bin=$root/target/release/examples/load

work=$(mktemp -d "$root/target/formats.XXXXXX")
trap 'kill_all; rm -rf "$work"' EXIT

# start BIN DIR FSYNC: spoold on DIR/spool (a config written if missing).
start() {
  [ -f "$2/spoold.toml" ] || write_config "$2" "$3"
  run_spoold "$1" "$2"
}
stop() { stop_spoold; }

# replay BIN DIR: start on an existing spool; prints "replay_ms rss_kib records".
replay() {
  : >"$2/log"
  run_spoold "$1" "$2"
  sleep 1
  local rss line
  rss=$(rss_kib "$spoold_pid")
  line=$(grep "spool open" "$2/log")
  stop_spoold
  echo "$(field replay_ms "$line") $rss $(field records "$line")"
}

echo "== durable sends at 64 connections, interleaved" >&2
for trial in $(seq 1 "$TRIALS"); do
  for which in old new; do
    bin=$OLD_BIN; [ "$which" = new ] && bin=$new_bin
    rm -rf "$work/sends"
    start "$bin" "$work/sends" true
    line=$(BODY_BYTES=1024 wrk -t2 -c64 -d"${DURATION}s" --latency -s bench/post.lua \
      "http://127.0.0.1:$PORT/v1/queues/bench/messages" | grep RESULT)
    stop
    echo "sends format=$which trial=$trial $line"
  done
done

echo "== replay of $REPLAY_MESSAGES messages and memory per message" >&2
for which in old new; do
  bin=$OLD_BIN; [ "$which" = new ] && bin=$new_bin
  dir=$work/replay-$which
  start "$bin" "$dir" false
  empty=$(rss_kib "$spoold_pid")
  "$load_bin" --url "http://127.0.0.1:$PORT" --queue bench --messages "$REPLAY_MESSAGES" fill --clients 64 >/dev/null
  stop
  sed -i 's/^fsync = false/fsync = true/' "$dir/spoold.toml"
  echo "$empty" >"$dir/empty_rss"
done
sync
for trial in $(seq 1 "$TRIALS"); do
  for which in old new; do
    bin=$OLD_BIN; [ "$which" = new ] && bin=$new_bin
    dir=$work/replay-$which
    read -r ms rss records <<<"$(replay "$bin" "$dir")"
    empty=$(cat "$dir/empty_rss")
    echo "replay format=$which trial=$trial messages=$REPLAY_MESSAGES records=$records replay_ms=$ms rss_bytes_per_msg=$(((rss - empty) * 1024 / REPLAY_MESSAGES))"
  done
done

echo "== format 2: the 1 M messages in a checkpoint (after journal compact)" >&2
dir=$work/replay-new
"$new_bin" journal compact --dir "$dir/spool" | tail -1 >&2
sync
for trial in $(seq 1 "$TRIALS"); do
  read -r ms rss records <<<"$(replay "$new_bin" "$dir")"
  empty=$(cat "$dir/empty_rss")
  echo "replay format=new-checkpoint trial=$trial messages=$REPLAY_MESSAGES records_after_checkpoint=$records replay_ms=$ms rss_bytes_per_msg=$(((rss - empty) * 1024 / REPLAY_MESSAGES))"
done

echo "== format 2: 1 M records after a checkpoint" >&2
dir=$work/after
start "$new_bin" "$dir" false
curl -fs -X PUT "http://127.0.0.1:$PORT/v1/queues/other" >/dev/null
stop
"$new_bin" journal compact --dir "$dir/spool" >/dev/null
start "$new_bin" "$dir" false
empty=$(rss_kib "$spoold_pid")
"$load_bin" --url "http://127.0.0.1:$PORT" --queue bench --messages "$REPLAY_MESSAGES" fill --clients 64 >/dev/null
stop
sed -i 's/^fsync = false/fsync = true/' "$dir/spoold.toml"
sync
for trial in $(seq 1 "$TRIALS"); do
  read -r ms rss records <<<"$(replay "$new_bin" "$dir")"
  echo "replay format=new-after-checkpoint trial=$trial messages=$REPLAY_MESSAGES records_after_checkpoint=$records replay_ms=$ms rss_bytes_per_msg=$(((rss - empty) * 1024 / REPLAY_MESSAGES))"
done
