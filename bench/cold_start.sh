#!/usr/bin/env bash
# A fresh instance under load at once, as in a rolling deploy or a scale-out:
# p99 latency over the first second and over the first 6 s after start, for
# ratewarden and for nginx, forwarding and rejecting, in the same run.
#
#   bash bench/cold_start.sh [BIN]     # ROUNDS=3
#
# Each measurement starts a new proxy process (nginx: a new master and
# worker; ratewarden: --workers 1), waits for its port, and at once runs
# `wrk -t2 -c64 --latency` for 1 s (first second) or 6 s (first 6 s); the
# proxy is then stopped. The origin (nginx `return 200`) stays up. Proxies
# on CPU 0, wrk and the origin on CPU 1. Prints p99 per round and the
# medians. Everything on 127.0.0.1, bounded, stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
if [ $# -gt 0 ]; then BIN=$1; else
  cargo build --release --bin ratewarden -q
  BIN=$PWD/target/release/ratewarden
fi
. bench/lib.sh
install_missing nginx:nginx-light wrk:wrk
UP=$(port)
origin_conf "$WORK/o" "$UP"
taskset -c 1 nginx -p "$WORK/o" -c "$WORK/o/nginx.conf" & PIDS+=($!)
wait_port "$UP"
printf 'admin: null\nrules:\n  - {name: open, algorithm: gcra, limit: 1000000, window: 1s}\n' > "$WORK/fwd.yaml"
printf 'admin: null\nrules:\n  - {name: shut, algorithm: gcra, limit: 1, window: 60s}\n' > "$WORK/rej.yaml"

# p99 (ms) from wrk --latency output.
p99() { awk '$1 == "99%" { v = $2; if (v ~ /us$/) { sub(/us$/, "", v); v /= 1000 } else if (v ~ /ms$/) { sub(/ms$/, "", v) } else if (v ~ /s$/) { sub(/s$/, "", v); v *= 1000 } printf "%.2f", v }'; }

# fresh PROXY MODE SECONDS: start, load at once, stop; prints p99 ms.
fresh() {
  local proxy=$1 mode=$2 secs=$3 port pid out
  port=$(port)
  if [ "$proxy" = nginx ]; then
    local limit=$NGX_OPEN
    [ "$mode" = rejecting ] && limit=$NGX_SHUT
    nginx_conf "$WORK/n$port" "$NGX_ZONES
      $(ngx_upstream "$UP")
      $(ngx_proxy "$port" "$limit")"
    taskset -c 0 nginx -p "$WORK/n$port" -c "$WORK/n$port/nginx.conf" & pid=$!
  else
    local conf=$WORK/fwd.yaml
    [ "$mode" = rejecting ] && conf=$WORK/rej.yaml
    RUST_LOG=off taskset -c 0 "$BIN" serve -c "$conf" --listen 127.0.0.1:$port \
      --upstream http://127.0.0.1:$UP --workers 1 > /dev/null & pid=$!
  fi
  wait_port "$port"
  out=$(taskset -c 1 wrk -t2 -c64 -d"${secs}s" --latency "http://127.0.0.1:$port/")
  kill "$pid"; wait "$pid" 2> /dev/null || true
  p99 <<< "$out"
}

median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

echo "p99 ms of a fresh instance under wrk -t2 -c64 (rounds: $ROUNDS)"
for mode in forwarding rejecting; do
  for secs in 1 6; do
    for proxy in nginx ratewarden; do
      vals=()
      for _ in $(seq "$ROUNDS"); do vals+=("$(fresh "$proxy" "$mode" "$secs")"); done
      printf '%-10s %-10s first %ss: %s  median %s\n' "$mode" "$proxy" "$secs" "${vals[*]}" \
        "$(printf '%s\n' "${vals[@]}" | median)"
    done
  done
done
