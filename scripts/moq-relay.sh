#!/usr/bin/env bash
# Builds the MOQT relay of the moq-dev project, unmodified, from crates.io: `moq-relay`
# (draft-14 over raw QUIC, ALPN `moq-00`), with only its QUIC backend (`noq`; the default
# features add iroh, WebSocket, Unix sockets and mDNS clustering, none of which the relay
# tests use). Not `--locked`: the registry mirror these machines reach lacks some of the
# exact versions its lock file names. Installs it once under the cache directory and prints
# the binary's path.
#
#   scripts/moq-relay.sh
set -euo pipefail
version=0.17.10
root="${ABHYASA_CACHE:-$HOME/.cache/abhyasa}/moq-relay-$version"
bin="$root/bin/moq-relay"
if [ ! -x "$bin" ]; then
  cargo install moq-relay --version "$version" --no-default-features --features noq \
    --root "$root" >&2
fi
"$bin" --version >&2 || true
echo "$bin"
