#!/usr/bin/env bash
# Runs every fuzz target (or those named) for a given time each, two at a
# time (this machine has 2 cores), then minimises each corpus in place so
# the repo keeps it small. Prints per target: runs, execs/s, coverage
# (libFuzzer's cov: edges) and corpus files, and whether it stayed clean.
#
#   bash bench/fuzz.sh [SECONDS] [TARGET...]      # SECONDS=900 (15 min)
#
# Needs the nightly toolchain and cargo-fuzz (installed if missing). A crash
# leaves its input in fuzz/artifacts/TARGET/: make it a regression test.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
SECS=${1:-900}; shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(h1_request h1_response path_normalizer forwarded config differential rls_request request_view jwt authz_dialect)
command -v cargo-fuzz > /dev/null || cargo install cargo-fuzz
cargo +nightly fuzz build -O > /dev/null 2>&1
LOGS=$(mktemp -d); trap 'rm -rf "$LOGS"' EXIT
run() {
  local t=$1
  mkdir -p "corpus/$t"
  cargo +nightly fuzz run -O "$t" -- -max_total_time="$SECS" -max_len=4096 -timeout=10 \
    -print_final_stats=1 > "$LOGS/$t.log" 2>&1 && echo clean > "$LOGS/$t.result" || echo CRASHED > "$LOGS/$t.result"
}
i=0
for t in "${TARGETS[@]}"; do
  run "$t" & i=$((i + 1))
  if [ $((i % 2)) -eq 0 ]; then wait; fi
done
wait
printf '%-16s %10s %10s %8s %8s %s\n' target runs execs/s cov files result
for t in "${TARGETS[@]}"; do
  log=$LOGS/$t.log
  runs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
  rate=$(awk '/stat::average_exec_per_sec/ {print $2}' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  # Keep only inputs that add coverage.
  cargo +nightly fuzz cmin -O "$t" > /dev/null 2>&1 || true
  files=$(ls "corpus/$t" | wc -l)
  printf '%-16s %10s %10s %8s %8s %s\n' "$t" "${runs:-?}" "${rate:-?}" "${cov:-?}" "$files" "$(cat "$LOGS/$t.result")"
done
