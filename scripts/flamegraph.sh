#!/usr/bin/env bash
# A flamegraph (SVG) and a grouped flat profile of one benchmark, as in docs/BENCHMARKS.md:
#
#   scripts/flamegraph.sh throughput 'custody_in_flight/1024$' docs/bench/flame-custody-1024.svg
#   scripts/flamegraph.sh ledger 'ledger_two_nodes/in_flight_1024$' docs/bench/flame-ledger-two-nodes-1024.svg two_nodes
#
# Arguments: the bench target, a criterion filter, the SVG to write, and optionally a word that
# every kept stack must contain (or that starts its thread's name) — criterion runs each group's
# setup even when the filter skips its benchmarks, and this keeps that setup out of the profile.
# Needs perf and inferno (`cargo install inferno --locked --version 0.12.3`); builds with
# `--profile profiling` (release with line tables).
set -euo pipefail
cd "$(dirname "$0")/.."
bench="$1" filter="$2" svg="$3" keep="${4:-}"
command -v inferno-flamegraph >/dev/null || { echo "inferno is not installed: cargo install inferno --locked --version 0.12.3"; exit 1; }
exe=$(cargo bench --profile profiling --bench "$bench" --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["bench"]: print(m["executable"])' | tail -n 1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
perf record -F 199 --call-graph dwarf,16384 -o "$work/perf.data" -- "$exe" --bench "$filter" \
  --warm-up-time 1 --measurement-time 8 | grep -E "time:|thrpt:" || true
perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf --all > "$work/all.folded"
if [ -n "$keep" ]; then
  grep -E "$keep|^gateway-node" "$work/all.folded" > "$work/kept.folded" || true
else
  cp "$work/all.folded" "$work/kept.folded"
fi
inferno-flamegraph --title "$bench $filter, perf -F 199 --call-graph dwarf, $(date -u +%F)" \
  --minwidth 0.5 --width 1600 < "$work/kept.folded" > "$svg"
echo "wrote $svg"
python3 scripts/profile-groups.py "$work/kept.folded"
