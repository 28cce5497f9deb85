#!/usr/bin/env bash
# A flood from one key on Redis: Redis's CPU and decision calls per refused
# request, two gateway builds in alternating rounds (issue 51's refusal
# cache: a build with it beside one without).
#
#   bash bench/refusal_flood.sh BIN_A BIN_B [ROUNDS]   # ROUNDS=3, D=5 (seconds)
#
# redis-server on CPU 0 (fresh per run); the gateway (--workers 1) and
# `wrk -t1 -c64` on CPU 1, every request from 127.0.0.1 under one rule of 1
# an hour (so all but the first are refused). Per run: requests wrk made,
# Redis's CPU (INFO cpu, user + system) and its decision calls (FCALL and
# EVALSHA in INFO commandstats), each per request. Loopback only; stopped at
# the end.
set -euo pipefail
A=$1; B=$2; ROUNDS=${3:-3}; D=${D:-5}
. "$(dirname "$0")/lib.sh"
install_missing redis-server:redis-server wrk:wrk
calls() {
  cli info commandstats | tr -d '\r' | awk -F'[=,:]' '/^cmdstat_(fcall|evalsha|fcall_ro):/ {s += $3} END {print s + 0}'
}
run() {
  local bin=$1 rw conf p
  redis_on_cpu0
  rw=$(port); conf=$WORK/flood.yaml
  printf 'admin: null\nupstream: echo\nstore: {type: redis, url: "redis://127.0.0.1:%s"}\nrules:\n  - {name: flood, algorithm: fixed_window, limit: 1, window: 1h}\n' "$PORT" > "$conf"
  RUST_LOG=off taskset -c 1 "$bin" serve -c "$conf" --listen 127.0.0.1:$rw --workers 1 > /dev/null 2>&1 &
  p=$!
  wait_port "$rw"
  curl -s -o /dev/null "http://127.0.0.1:$rw/"
  local c0 k0 out n c1 k1
  c0=$(cpu); k0=$(calls)
  out=$(taskset -c 1 wrk -t1 -c64 -d"${D}s" "http://127.0.0.1:$rw/")
  c1=$(cpu); k1=$(calls)
  n=$(awk '/requests in/ {print $1}' <<< "$out")
  kill "$p"; wait "$p" 2>/dev/null || true
  redis_cli shutdown nosave > /dev/null 2>&1 || true
  awk -v n="$n" -v c="$(echo "$c1 - $c0" | bc -l)" -v k="$((k1 - k0))" -v b="$bin" \
    'BEGIN { printf "%-40s %9d requests  %8.3f us Redis CPU/req  %.4f Redis calls/req\n", b, n, c * 1e6 / n, k / n }'
}
for _ in $(seq "$ROUNDS"); do run "$A"; run "$B"; done
