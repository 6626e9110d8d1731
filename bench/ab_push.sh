#!/usr/bin/env bash
# Push end to end, two builds interleaved trial by trial (the `push`
# section of bench/run.sh for each): OLD_BIN against this tree's release
# build. Prints one result line per trial.
#
#   OLD_BIN=/path/to/other/spoold TRIALS=5 bench/ab_push.sh
#
# Or one build with two configs: OLD_CONFIG and NEW_CONFIG head each
# side's config file, as dotted keys (OLD_BIN defaults to this tree's
# build then):
#
#   OLD_CONFIG='delivery.plain_http_client = "pooled"' bench/ab_push.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. bench/lib.sh
if [ -z "${OLD_CONFIG:-}${NEW_CONFIG:-}" ]; then
  : "${OLD_BIN:?set OLD_BIN to the other build of spoold, or OLD_CONFIG}"
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
    bin=${OLD_BIN:-$new_bin} EXTRA_CONFIG=${OLD_CONFIG:-}
    if [ "$which" = new ]; then bin=$new_bin EXTRA_CONFIG=${NEW_CONFIG:-}; fi
    echo "push build=$which trial=$trial $(push_once "$bin")"
  done
done
