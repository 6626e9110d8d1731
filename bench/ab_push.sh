#!/usr/bin/env bash
# Push end to end, two builds interleaved trial by trial (the `push`
# section of bench/run.sh for each): OLD_BIN against this tree's release
# build. Prints one result line per trial.
#
#   OLD_BIN=/path/to/other/spoold TRIALS=5 bench/ab_push.sh
#
# Or one build with two configs: OLD_SERVER_KEYS and NEW_SERVER_KEYS are
# more `[server]` lines for each side (OLD_BIN defaults to this tree's
# build then):
#
#   OLD_SERVER_KEYS='plain_http_client = "pooled"' bench/ab_push.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. bench/lib.sh
if [ -z "${OLD_SERVER_KEYS:-}${NEW_SERVER_KEYS:-}" ]; then
  : "${OLD_BIN:?set OLD_BIN to the other build of spoold, or OLD_SERVER_KEYS}"
fi
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
    bin=${OLD_BIN:-$new_bin} SERVER_KEYS=${OLD_SERVER_KEYS:-}
    if [ "$which" = new ]; then bin=$new_bin SERVER_KEYS=${NEW_SERVER_KEYS:-}; fi
    echo "push build=$which trial=$trial $(push_once "$bin")"
  done
done
