#!/usr/bin/env bash
# One global key past one Redis core (issue 18): leased local quotas
# (`distribution: {mode: lease}`) against the key's single-key Redis
# ceiling, in the same run.
#
#   bash bench/hot_key.sh [SECONDS]     # SECONDS=5 per run
#
# - ceiling: redis-benchmark -c 64 -P 16 calling the store's own Function
#   (FCALL, fixed_window) on one key: the most one Redis core decides for
#   one key;
# - direct: 4 processes of the gateway's decision stack
#   (examples/hot_key.rs: the Redis store with its fallback, 64 tasks each)
#   on one global fixed_window key (a limit no run reaches), not leased:
#   each decision a Redis call;
# - lease: the same 4 processes with the rule leased (epsilon 0.01,
#   max_share 0.25), and with epsilon 0.00001.
# redis-server on CPU 0; redis-benchmark and the four processes on CPU 1.
# Prints decisions/s, the ratio to the ceiling, and Redis CPU per decision.
set -euo pipefail
SECONDS_PER_RUN=${1:-5}
cd "$(dirname "$0")/.."
. bench/lib.sh
install_missing redis-server:redis-server redis-benchmark:redis-tools
cargo build --release -q -p ratewarden --example redis_argv --example hot_key
FN=$(target/release/examples/redis_argv "$WORK/decide.lua" "$WORK/library.lua" 2>&1 > "$WORK/argv")
FW_ARGS=$(awk '$1 == "fixed_window" { $1 = ""; $2 = ""; print }' "$WORK/argv")

redis_on_cpu0
cli function load "$(cat "$WORK/library.lua")" > /dev/null

N=$((200000 * SECONDS_PER_RUN))
before=$(cpu)
# shellcheck disable=SC2086
CEILING=$(taskset -c 1 redis-benchmark -p "$PORT" -c 64 -P 16 -n "$N" -q fcall "$FN" 1 '{k}' $FW_ARGS \
  | tr '\r' '\n' | grep -oE '[0-9.]+ requests per second' | tail -1 | cut -d' ' -f1)
after=$(cpu)
printf '%-44s %10.0f decisions/s  %6.2f us Redis CPU/decision\n' \
  "ceiling: FCALL fixed_window, one key, -P 16" "$CEILING" \
  "$(echo "($after - $before) * 1000000 / $N" | bc -l)"

# run LABEL [--lease]: four processes at once; sums their decisions.
run() {
  local label=$1; shift
  cli flushall > /dev/null
  local before after total=0 rate=0 local_=0 grants=0 pids=() i
  before=$(cpu)
  for i in 1 2 3 4; do
    taskset -c 1 target/release/examples/hot_key "redis://127.0.0.1:$PORT" "$@" \
      --seconds "$SECONDS_PER_RUN" > "$WORK/out.$i" & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  after=$(cpu)
  for i in 1 2 3 4; do
    line=$(cat "$WORK/out.$i")
    total=$((total + $(load_field decisions "$line")))
    rate=$((rate + $(load_field rate "$line")))
    local_=$((local_ + $(load_field local "$line")))
    grants=$((grants + $(load_field grants "$line")))
  done
  printf '%-44s %10d decisions/s  %6.3f us Redis CPU/decision  %5.2fx the ceiling  (local %d, grants %d)\n' \
    "$label" "$rate" "$(echo "($after - $before) * 1000000 / $total" | bc -l)" \
    "$(echo "$rate / $CEILING" | bc -l)" "$local_" "$grants"
}
run "direct: 4 processes x 64 tasks, one key"
run "lease: 4 processes x 64 tasks, one key" --lease
# A lease room 1000 times smaller (epsilon 1e-5: 40,000 of the limit;
# slices of at most 10,000): many more grants.
run "lease, epsilon 0.00001" --lease --epsilon-ppm 10
