#!/usr/bin/env bash
# User-space instructions per request of two ratewarden builds on one config,
# counted by valgrind's callgrind: unlike CPU time, a count that does not
# drift from run to run, so a change of 1% shows.
#
#   bash bench/instructions.sh CONFIG.yaml BIN_A BIN_B [CONFIG_B.yaml]   # N1=500 N2=2500 requests
#
# With CONFIG_B, B runs on that config (BIN_A and BIN_B may be the same file).
# HEADER='Name: value' adds a header to every request (an API key).
# LOG=info runs with the log on (default off).
# KEEP=DIR keeps each run's callgrind file there (for callgrind_annotate).
# H2=1 sends HTTP/2 (h2c) instead, which hyper serves: then everything the
# process runs is counted (start-up cancels out in the difference below),
# since `serve_connection` is the HTTP/1.1 path's.
#
# Each build runs as a proxy (--workers 1) under callgrind, collecting only
# inside `serve_connection` (one client connection's task: parsing, the
# decision, the upstream exchange, the answer; not the kernel, not timers or
# start-up), in front of an nginx `return 200` origin, and h2load sends N1
# then, on a fresh process, N2 requests over 4 kept-alive HTTP/1.1
# connections. (count(N2) - count(N1)) / (N2 - N1) is the cost of one
# request, connection set-up cancelled out. Prints it per build and B / A.
# Everything on 127.0.0.1; each run stops when h2load is done.
set -euo pipefail
CONF_A=$1; A=$2; B=$3; CONF_B=${4:-$1}; N1=${N1:-500}; N2=${N2:-2500}
. "$(dirname "$0")/lib.sh"
install_missing nginx:nginx-light valgrind:valgrind h2load:nghttp2-client
UP=$(port)
origin_conf "$WORK/origin" "$UP"
nginx -p "$WORK/origin" -c "$WORK/origin/nginx.conf" & PIDS+=($!)
wait_port "$UP"

# count BIN N: instructions inside serve_connection for N requests, on $CONF.
count() {
  local rw out=$WORK/cg.out
  rw=$(port)
  local collect=(--toggle-collect='*serve_connection*') proto=(--h1)
  [ -z "${H2:-}" ] || { collect=(); proto=(); }
  RUST_LOG=${LOG:-off} valgrind --tool=callgrind "${collect[@]}" \
    --callgrind-out-file="$out" "$1" serve -c "$CONF" --listen 127.0.0.1:$rw \
    --upstream http://127.0.0.1:$UP --workers 1 > /dev/null 2> "$WORK/valgrind.log" &
  local p=$!
  for _ in $(seq 300); do (echo > /dev/tcp/127.0.0.1/$rw) 2>/dev/null && break; sleep 0.1; done
  h2load "${proto[@]}" ${HEADER:+-H "$HEADER"} -n "$2" -c 4 -m 1 "http://127.0.0.1:$rw/" | grep -q "$2 succeeded\|$2 done" \
    || { echo "h2load did not complete $2 requests" >&2; exit 1; }
  kill -INT $p; wait $p 2>/dev/null || true
  [ -z "${KEEP:-}" ] || cp "$out" "$KEEP/$(basename "$1")-$2.out"
  awk '/^summary:/ {print $2}' "$out"
}

per_request() {
  local a b
  a=$(count "$1" "$N1"); b=$(count "$1" "$N2")
  echo $(( (b - a) / (N2 - N1) ))
}

CONF=$CONF_A; ia=$(per_request "$A"); CONF=$CONF_B; ib=$(per_request "$B")
printf '%-40s %8d instructions/request\n' "A $A $CONF_A" "$ia" "B $B $CONF_B" "$ib"
awk -v a="$ia" -v b="$ib" 'BEGIN { printf "B / A = %.3f\n", b / a }'
