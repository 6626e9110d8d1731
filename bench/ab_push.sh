#!/usr/bin/env bash
# Push end to end, two builds interleaved trial by trial (the `push`
# section of bench/run.sh for each): OLD_BIN against this tree's release
# build. Prints one result line per trial.
#
#   OLD_BIN=/path/to/other/spoold TRIALS=5 bench/ab_push.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. bench/lib.sh
: "${OLD_BIN:?set OLD_BIN to the other build of spoold}"
TRIALS=${TRIALS:-3}
PUSH_MESSAGES=${PUSH_MESSAGES:-50000}
PORT=${PORT:-18807}
SINK_PORT=${SINK_PORT:-18809}
cargo build --release --quiet --bin spoold --example load
work=$(mktemp -d "$root/target/ab.XXXXXX")
trap 'kill_all; rm -rf "$work"' EXIT
new_bin=$root/target/release/spoold
load_bin=$root/target/release/examples/load
for trial in $(seq 1 "$TRIALS"); do
  for which in old new; do
    bin=$OLD_BIN; [ "$which" = new ] && bin=$new_bin
    echo "push build=$which trial=$trial $(push_once "$bin")"
  done
done
