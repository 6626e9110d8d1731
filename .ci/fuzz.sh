#!/usr/bin/env bash
# Coverage-guided fuzzing with cargo fuzz (libFuzzer), each target for a
# bounded time. Fails on any crash, panic or failed assertion; the input
# that caused it is left in fuzz/artifacts/<target>/ and printed here, and
# becomes a regression test in tests/engine/fuzz.rs.
#
# cargo fuzz wants a nightly compiler for its instrumentation flags;
# RUSTC_BOOTSTRAP=1 lets the machine's stable toolchain accept them. No
# sanitizer (the library denies unsafe code but for one cache-prefetch hint
# in the journal scan, which touches no memory; coverage guidance and debug
# assertions are what find its bugs), which also keeps the build short.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-20}"
targets=(replay record_decode config lease_token forward_path)
export RUSTC_BOOTSTRAP=1

command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked --quiet
cargo fuzz build --sanitizer none --debug-assertions

for target in "${targets[@]}"; do
  echo "-- fuzz $target (${seconds}s)"
  log="$(mktemp)"
  # Start from the committed seeds (real journals) and every input that
  # once crashed, besides what earlier local runs left in fuzz/corpus.
  corpora=("fuzz/corpus/$target")
  mkdir -p "${corpora[0]}"
  for extra in "fuzz/seeds/$target" "fuzz/regressions/$target"; do
    [ -d "$extra" ] && corpora+=("$extra")
  done
  if ! cargo fuzz run --sanitizer none --debug-assertions "$target" "${corpora[@]}" -- \
      -max_total_time="$seconds" -max_len=4096 >"$log" 2>&1; then
    tail -n 60 "$log"
    for crash in fuzz/artifacts/"$target"/*; do
      [ -f "$crash" ] || continue
      echo "input that failed ($crash), base64:"
      base64 -w0 "$crash"; echo
    done
    exit 1
  fi
  grep -E '^Done [0-9]+ runs' "$log" || tail -n 3 "$log"
  rm -f "$log"
done
