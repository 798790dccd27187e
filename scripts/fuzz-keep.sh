#!/usr/bin/env bash
# Merges what a fuzzing run found (fuzz/corpus/<target>) into fuzz/kept/<target>.tar.gz,
# keeping only the inputs that add coverage (libFuzzer's -merge=1), so the committed corpus
# stays small and the next run — a developer's, or CI's few seconds — starts from the
# coverage the long run reached. Each target's corpus is one archive (thousands of small
# files were 97% of the checkout's files), written the same way every time (sorted names,
# no times, no owners) so an unchanged corpus is an unchanged file. Prints one line per
# target: target,kept_before,kept_after,bytes.
#
#   scripts/fuzz-keep.sh obligation signed   # the targets whose corpora to keep
#
# The binding targets (mcp_meta, a2a_json, config, signed) are built with --features bindings.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
[ $# -gt 0 ] || { echo "usage: scripts/fuzz-keep.sh <target>…" >&2; exit 2; }
if rustup run nightly rustc --version >/dev/null 2>&1; then
  fuzz=(cargo +nightly fuzz)
else
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo fuzz)
fi
"${fuzz[@]}" build -O --features bindings >&2
echo "target,kept_before,kept_after,bytes"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for t in "$@"; do
  [ -d "corpus/$t" ] || { echo "no fuzz/corpus/$t: run scripts/fuzz.sh first" >&2; exit 1; }
  mkdir -p "$work/$t"
  [ -f "kept/$t.tar.gz" ] && tar -xzf "kept/$t.tar.gz" -C "$work/$t"
  before=$(find "$work/$t" -type f | wc -l)
  "${fuzz[@]}" run -O --features bindings "$t" "$work/$t" "corpus/$t" -- -merge=1 \
    -timeout="${FUZZ_TIMEOUT:-20}" -rss_limit_mb=4096 >/dev/null 2>&1 || {
    echo "merging $t failed" >&2
    exit 1
  }
  after=$(find "$work/$t" -type f | wc -l)
  (cd "$work/$t" && find . -type f -printf '%P\n' | LC_ALL=C sort \
    | tar --mtime='@0' --owner=0 --group=0 --numeric-owner --mode='a+r,u+w,go-w' -cf - -T - \
    | gzip -n -9) > "kept/$t.tar.gz"
  echo "$t,$before,$after,$(find "$work/$t" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}')"
done
