#!/usr/bin/env bash
# Envoy RLS ShouldRateLimit beside POST /v1/check: decisions/s, p99 and the
# server's CPU per decision, on memory and on Redis, in one run. (Earlier
# runs had limitador-server beside them, a binary built from its repository;
# none is installable from a package registry, so it is no longer a peer
# here: BENCHMARKS.md keeps those figures as history.)
#
#   bash bench/rls.sh [SECONDS]      # 5 s per load; RW=path/to/ratewarden
#   BUDGET=0.5 bash bench/rls.sh     # servers limited to half of CPU 0 (a
#                                    # cgroup quota): they, not the load
#                                    # generator, set the decisions/s
#   STORES=memory bash bench/rls.sh  # one store only (memory or redis)
#
# Each server runs alone, pinned to CPU 0 (Redis, when used, shares CPU 0: a
# decision's Redis work is part of its cost); the load generator
# (examples/rls_load.rs: 64 calls in flight, one descriptor of 10,000
# distinct values in turn, never over its limit) runs on CPU 1. CPU per
# decision is the server's (and Redis's) user+system time from /proc over
# the load, divided by the decisions made. Loopback only; everything is
# stopped at the end.
set -euo pipefail
D=${1:-5}
cd "$(dirname "$0")/.."
. bench/lib.sh
install_missing redis-server:redis-server
cargo build --release -q -p ratewarden-gateway --bin ratewarden --example rls_load
RW=${RW:-target/release/ratewarden}
LOAD=target/release/examples/rls_load

ticks() { # PIDS...: user+system clock ticks of all of them
  local t=0
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat))); done
  echo $t
}
hz=$(getconf CLK_TCK)

# run LABEL "PIDS" LOAD-ARGS...: one load; prints rate, p99, CPU us/decision.
run() {
  local label=$1 pids=$2; shift 2
  local before after out calls
  before=$(ticks $pids)
  out=$(taskset -c 1 "$LOAD" "$@" --seconds "$D")
  after=$(ticks $pids)
  calls=$(load_field calls "$out")
  local errors rate p99
  errors=$(load_field errors "$out"); rate=$(load_field rate "$out"); p99=$(load_field p99_us "$out")
  printf '%-34s %8s decisions/s  p99 %6s us  %7.1f us CPU/decision  errors %s\n' \
    "$label" "$rate" "$p99" "$(echo "($after - $before) * 1000000 / $hz / $calls" | bc -l)" "$errors"
}

UNDER_TEST=
if [ -n "${BUDGET:-}" ]; then cpu_budget "$BUDGET"; UNDER_TEST=in_budget; fi

REDIS_PORT=$(port)
taskset -c 0 redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$WORK" > /dev/null & PIDS+=($!); REDIS_PID=$!
wait_port "$REDIS_PORT"

for store in ${STORES:-memory redis}; do
  if [ $store = memory ]; then STORE='{type: memory}'; PROC="" ; else
    STORE="{type: redis, url: 'redis://127.0.0.1:$REDIS_PORT', timeout: 1s}"; PROC=$REDIS_PID; fi
  RLS=$(port); ADMIN=$(port)
  cat > "$WORK/rw.yaml" <<YAML
admin: {listen: 127.0.0.1:$ADMIN}
store: $STORE
rules:
  - {name: r, algorithm: fixed_window, limit: 1000000000, window: 1m}
rls:
  listen: 127.0.0.1:$RLS
  domains:
    - domain: ns
      descriptors:
        - key: k
          rate_limit: {unit: minute, requests_per_unit: 1000000000}
YAML
  redis-cli -p "$REDIS_PORT" flushall > /dev/null
  RUST_LOG=warn $UNDER_TEST taskset -c 0 "$RW" serve -c "$WORK/rw.yaml" --listen 127.0.0.1:$(port) --workers 1 \
    > /dev/null & PIDS+=($!); P=$!
  wait_port "$RLS"; wait_port "$ADMIN"
  run "ratewarden RLS ($store)" "$P $PROC" grpc "http://127.0.0.1:$RLS"
  run "ratewarden POST /v1/check ($store)" "$P $PROC" http "http://127.0.0.1:$ADMIN/v1/check"
  kill "$P"; wait "$P" 2>/dev/null || true

done
