#!/usr/bin/env bash
# Runs every cargo-fuzz target (or the ones named) for SECONDS each and prints one CSV row per
# target: target,seconds,execs,execs_per_s,cov,ft,corpus,crashes.
#
#   scripts/fuzz.sh 15                      # the core targets, 15 s each (what .ci/run does)
#   scripts/fuzz.sh 600 --bindings          # also the MCP, A2A, config and signed-envelope targets
#   scripts/fuzz.sh 3600 obligation ledger  # some targets for an hour each
#
# Each target reads fuzz/seeds/<target> (committed: the golden vectors and hand-made bodies),
# fuzz/kept/<target>.tar.gz when there is one (committed: a long run's corpus, minimized by
# scripts/fuzz-keep.sh and kept as one archive, unpacked here into a temporary directory, so
# the next run starts from the coverage it reached) and grows fuzz/corpus/<target> (not
# committed). A crash stops the script with the input in
# hex; it becomes a regression test. Uses nightly when it is installed, otherwise the stable
# toolchain with RUSTC_BOOTSTRAP=1 (cargo-fuzz needs nightly flags).
#
# FUZZ_TIMEOUT (seconds, default 20): an input that runs longer is a finding. libFuzzer
# measures it in wall-clock time, so a long run that is paused (SIGSTOP, to keep a benchmark
# quiet) needs a timeout longer than the pause, or the pause itself reads as a timeout.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:?seconds per target}"
shift
features=()
bindings=()
if [ "${1:-}" = "--bindings" ]; then
  shift
  features=(--features bindings)
  bindings=(mcp_meta a2a_json config signed)
fi
if rustup run nightly rustc --version >/dev/null 2>&1; then
  fuzz=(cargo +nightly fuzz)
else
  echo "no nightly toolchain: cargo-fuzz on stable with RUSTC_BOOTSTRAP=1" >&2
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo fuzz)
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  # Every target but the bindings' (which need the feature), then those if asked for.
  mapfile -t targets < <("${fuzz[@]}" list | grep -vxE 'mcp_meta|a2a_json|config|signed')
  targets+=("${bindings[@]}")
fi
"${fuzz[@]}" build -O "${features[@]}" >&2
echo "target,seconds,execs,execs_per_s,cov,ft,corpus,crashes"
unpacked="$(mktemp -d)"
trap 'rm -rf "$unpacked"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  inputs=("seeds/$t")
  if [ -f "kept/$t.tar.gz" ]; then
    mkdir -p "$unpacked/$t"
    tar -xzf "kept/$t.tar.gz" -C "$unpacked/$t"
    inputs+=("$unpacked/$t")
  fi
  log="$(mktemp)"
  if ! "${fuzz[@]}" run -O "${features[@]}" "$t" "corpus/$t" "${inputs[@]}" -- \
      -max_total_time="$secs" -timeout="${FUZZ_TIMEOUT:-20}" -rss_limit_mb=4096 -print_final_stats=1 \
      > "$log" 2>&1; then
    # The whole log stays beside the input (the top of a stack trace is far above its end).
    kept="artifacts/$t/run-$(date -u +%Y%m%dT%H%M%SZ).log"
    cp "$log" "$kept"
    tail -n 60 "$log" >&2
    echo "the whole log: fuzz/$kept" >&2
    for a in "artifacts/$t"/crash-* "artifacts/$t"/timeout-* "artifacts/$t"/oom-*; do
      [ -f "$a" ] && { echo "crashing input $a:" >&2; od -A x -t x1z "$a" | head -n 40 >&2; }
    done
    echo "$t,$secs,,,,,,1"
    exit 1
  fi
  execs=$(grep -m1 -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
  last=$(grep -E '#[0-9]+.*cov: ' "$log" | tail -n 1 || true)
  cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo 0)
  ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo 0)
  corp=$(find "corpus/$t" -type f | wc -l)
  echo "$t,$secs,$execs,$(( execs / secs )),$cov,$ft,$corp,0"
  rm -f "$log"
done
