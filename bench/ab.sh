#!/usr/bin/env bash
# Alternating A/B of two ratewarden builds on one config: which one is faster?
#
#   bash bench/ab.sh CONFIG.yaml BIN_A BIN_B [ROUNDS] [CONFIG_B.yaml]   # ROUNDS=3, D=5 (seconds)
#
# With CONFIG_B, B runs on that config instead (one binary, two configs:
# BIN_A and BIN_B may be the same file; the means are then labelled A and B).
#
# Each round runs A then B as a proxy (--workers 1) pinned to CPU 0, in front of
# an nginx `return 200` origin on CPU 1, under `wrk -t2 -c64` on CPU 1, and
# prints for each run the requests per second and the proxy's CPU per request
# (user + system, from /proc/PID/stat over the wrk run, divided by the requests
# wrk completed). When wrk saturates CPU 1 (the rejecting path), only the CPU
# per request tells the builds apart. Means per build at the end. Everything on
# 127.0.0.1, bounded by D, stopped at the end. Needs nginx and wrk (see gateway.sh).
# LOG=info: the gateway logs as it would in production (default off).
# HEADER='Authorization: Bearer ...': every request carries this header.
# WRK_SCRIPT=FILE.lua: wrk runs this script (e.g. to vary a header).
# BUDGET=0.5: the proxy also limited to half of CPU 0 (see gateway.sh), so
# that it, not wrk, limits the run.
set -euo pipefail
CONF=$1; A=$2; B=$3; ROUNDS=${4:-3}; D=${D:-5}; CONF_B=${5:-$1}
. "$(dirname "$0")/lib.sh"
install_missing nginx:nginx-light wrk:wrk
UP=$(port); RW=$(port)
origin_conf "$WORK/origin" "$UP"
taskset -c 1 nginx -p "$WORK/origin" -c "$WORK/origin/nginx.conf" & PIDS+=($!)
wait_port "$UP"
TICK=$(getconf CLK_TCK)
UNDER_TEST=""
if [ -n "${BUDGET:-}" ]; then cpu_budget "$BUDGET"; UNDER_TEST=in_budget; fi
for _ in $(seq "$ROUNDS"); do
  for side in A B; do
    if [ $side = A ]; then bin=$A; conf=$CONF; else bin=$B; conf=$CONF_B; fi
    label=$bin
    [ "$A" = "$B" ] && label="$side:$bin"
    RUST_LOG=${LOG:-off} $UNDER_TEST taskset -c 0 "$bin" serve -c "$conf" --listen 127.0.0.1:$RW --upstream http://127.0.0.1:$UP --workers 1 > /dev/null &
    P=$!
    wait_port "$RW"
    t0=$(awk '{print $14 + $15}' /proc/$P/stat)
    out=$(taskset -c 1 wrk -t2 -c64 -d${D}s ${HEADER:+-H "$HEADER"} ${WRK_SCRIPT:+-s "$WRK_SCRIPT"} http://127.0.0.1:$RW/)
    t1=$(awk '{print $14 + $15}' /proc/$P/stat)
    kill $P; wait $P 2>/dev/null || true
    n=$(awk '/requests in/ {print $1}' <<< "$out")
    rps=$(awk '/Requests\/sec/ {print $2}' <<< "$out")
    awk -v b="$label" -v r="$rps" -v t="$((t1 - t0))" -v n="$n" -v k="$TICK" \
      'BEGIN { printf "%-40s %10.0f req/s %7.3f us CPU/req\n", b, r, t * 1e6 / k / n }'
  done
done | awk '{ print; r[$1] += $2; c[$1] += $4; m[$1]++ }
  END { for (b in r) printf "mean %-35s %10.0f req/s %7.3f us CPU/req\n", b, r[b] / m[b], c[b] / m[b] }'
