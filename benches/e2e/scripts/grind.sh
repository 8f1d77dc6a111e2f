#!/usr/bin/env bash
# grind.sh BIN [CONNS] [ROUNDS]: user-space instructions per governed round trip of the staleguard
# binary BIN under callgrind (e2e harness of the relay branch, 64 connections, closed loop).
set -euo pipefail
bin=$1; conns=${2:-64}; rounds=${3:-3}
E2E=${E2E_BIN:-$(ls -t "$(dirname "$0")"/../../../target/release/deps/e2e-* | grep -v "\.d$" | head -1)}
name=$(basename "$bin")
E2E_NO_INSTALL=1 E2E_SG_BIN="$bin" \
  E2E_SG_WRAPPER="valgrind --tool=callgrind --compress-strings=no --compress-pos=no --callgrind-out-file=${CG_OUT:-/tmp/cg}/$name.%p" \
  E2E_CALLGRIND=1 E2E_TARGETS=${E2E_TARGETS:-staleguard-governed} E2E_CONNS=$conns E2E_ROUNDS=$rounds \
  E2E_SECS=5 E2E_WARMUP=2 "$E2E" --no-memory --no-micro 2>&1 \
  | grep -E '^\| staleguard[a-z-]* \| [0-9]+ \| [0-9]+ \| [0-9]' | sed "s/^/$name /"
