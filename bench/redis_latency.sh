#!/usr/bin/env bash
# Redis call latency on this host, idle and with two CPU-bound processes
# beside it: what `store.timeout` and the breaker's thresholds were chosen
# from (README, *A slow Redis is not a down Redis*; BENCHMARKS.md).
#
#   bash bench/redis_latency.sh [ROUNDS] [CALLS]      # ROUNDS=3, CALLS=200000
#
# Each round runs, once on an idle host and once while two shell busy loops
# run, alternating:
# - redis-benchmark (16 connections, one EVAL of a small script that charges
#   a key and sets its expiry, as a decision does): p50, p99, p99.9 and the
#   worst call in ms;
# - the store's own client (examples/redis_latency.rs: 16 callers on a
#   two-worker tokio runtime, one decision each at a time, our script),
#   built in release first: the latency a gateway sees.
# Everything on 127.0.0.1, bounded by CALLS, stopped at the end.
set -euo pipefail
ROUNDS=${1:-3}; CALLS=${2:-200000}
. "$(dirname "$0")/lib.sh"
install_missing redis-server:redis-server redis-benchmark:redis-tools
PORT=$(port)
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no > /dev/null & PIDS+=($!)
wait_port "$PORT"
SCRIPT="local n = redis.call('INCR', KEYS[1]) redis.call('PEXPIRE', KEYS[1], 60000) return n"
pct() { awk -v p="$1" '/milliseconds \(cumulative/ { gsub("%","",$1); if ($1 + 0 >= p) { print $3; exit } }'; }
run() {
  out=$(redis-benchmark -p "$PORT" -n "$CALLS" -c 16 eval "$SCRIPT" 1 k 2>/dev/null | tr '\r' '\n')
  printf '%-6s p50 %6s  p99 %6s  p99.9 %6s  max %7s ms\n' "$1" \
    "$(pct 50 <<< "$out")" "$(pct 99 <<< "$out")" "$(pct 99.9 <<< "$out")" "$(pct 100 <<< "$out")"
}
cargo build -q --release -p ratewarden --example redis_latency
BIN=$(dirname "$0")/../target/release/examples/redis_latency
[ -n "${CARGO_TARGET_DIR:-}" ] && BIN=$CARGO_TARGET_DIR/release/examples/redis_latency
client() { printf '%-6s ours  %s\n' "$1" "$("$BIN" "redis://127.0.0.1:$PORT" "$CALLS" 16)"; }
for _ in $(seq "$ROUNDS"); do
  run idle; client idle
  hogs=()
  for _ in 1 2; do sh -c 'while :; do :; done' & hogs+=($!); done
  run busy; client busy
  kill "${hogs[@]}"; wait "${hogs[@]}" 2>/dev/null || true
done
