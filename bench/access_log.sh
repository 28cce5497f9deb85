#!/usr/bin/env bash
# What the JSON access log costs, ratewarden's beside nginx's, in one run.
#
#   bash bench/access_log.sh [ROUNDS]   # ROUNDS=8, D=4 (seconds a pair)
#   SEQUENTIAL=1 bash bench/access_log.sh [ROUNDS]   # one proxy at a time
#
# Proxies: ratewarden (--workers 1, a gcra rule never reached) and nginx
# (worker_processes 1, proxy_pass to a kept-alive upstream), each with no
# access log, with a JSON access log to a file, to /dev/null, and to standard
# output read through a pipe by `cat` on CPU 1 (as a container runtime reads
# it).
# The proxies are pinned to CPU 0; an nginx `return 200` origin and the wrk
# load are on CPU 1. CPU per request is user + system of the proxy's
# process, every thread, from /proc/PID/stat over the wrk run, divided by
# the requests wrk completed.
#
# Paired (the default): each round runs, for each proxy, two of its
# configurations at the same time, side by side on CPU 0, each under its own
# `wrk -t1 -c32`: log off beside log off (the control: how far apart two
# equal sides come out), log off beside each sink.
# Both sides of a pair share whatever else the host is doing at that moment,
# so their ratio holds still where one-at-a-time runs on a busy host swing
# by 10% and more. Prints each pair's ratio, then per configuration the
# mean, lowest and highest ratio to the log-off side of its own pair.
#
# SEQUENTIAL=1: each round runs every configuration alone in turn (wrk -t2
# -c64) and compares means, as this script did before the pairs.
#
# nginx's line carries the same fields as ratewarden's (`escape=json`,
# `buffer=64k flush=1s`, as ratewarden's per-thread batches of 64 KiB).
# The file is in a temporary directory (on the disk /tmp is on), truncated
# before each run. Everything on 127.0.0.1, bounded by D, stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-8}; D=${D:-4}
cargo build --release --bin ratewarden -q
BIN=${BIN:-$PWD/target/release/ratewarden}
. bench/lib.sh
install_missing nginx:nginx-light wrk:wrk
UP=$(port)
origin_conf "$WORK/origin" "$UP"
taskset -c 1 nginx -p "$WORK/origin" -c "$WORK/origin/nginx.conf" & PIDS+=($!)
wait_port "$UP"
NGX_LINE="log_format line escape=json '{\"time\":\"\$time_iso8601\",\"remote_addr\":\"\$remote_addr\",\"method\":\"\$request_method\",\"target\":\"\$request_uri\",\"protocol\":\"\$server_protocol\",\"status\":\$status,\"bytes\":\$body_bytes_sent,\"duration_ms\":\$request_time,\"request_id\":\"\$request_id\",\"referer\":\"\$http_referer\",\"user_agent\":\"\$http_user_agent\"}';"
TICK=$(getconf CLK_TCK)
PAIRS=0
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# start PROXY SINK PORT N: starts one proxy (SINK off, file, null or pipe;
# its file is $WORK/access-N.log) on PORT; sets P (to stop) and PID (to read).
start() {
  local to="" dir=$WORK/$1-$2-$4 out=/dev/null
  case $2 in
    file) to=$WORK/access-$4.log; : > "$to" ;;
    null) to=/dev/null ;;
    pipe) out=$WORK/pipe-$4; rm -f "$out"; mkfifo "$out"
      taskset -c 1 cat "$out" > /dev/null & PIDS+=($!) ;;
  esac
  if [ "$1" = ratewarden ]; then
    {
      echo "admin: null"
      [ -n "$to" ] && echo "access_log: {path: $to, format: json}"
      [ "$2" = pipe ] && echo "access_log: {path: stdout, format: json}"
      printf 'rules:\n  - {name: open, algorithm: gcra, limit: 1000000, window: 1s}\n'
    } > "$dir.yaml"
    RUST_LOG=off taskset -c 0 "$BIN" serve -c "$dir.yaml" --listen "127.0.0.1:$3" \
      --upstream "http://127.0.0.1:$UP" --workers 1 > "$out" &
    P=$!; wait_port "$3"; PID=$P
  else
    local log="access_log off;"
    [ -n "$to" ] && log="$NGX_LINE access_log $to line buffer=64k flush=1s;"
    [ "$2" = pipe ] && log="$NGX_LINE access_log /dev/stdout line buffer=64k flush=1s;"
    mkdir -p "$dir/logs"
    cat > "$dir/nginx.conf" <<NGINX
worker_processes 1;
error_log $dir/logs/error.log crit;
pid $dir/nginx.pid;
daemon off;
events { worker_connections 4096; }
http { $log
  $(ngx_upstream "$UP")
  $(ngx_proxy "$3") }
NGINX
    taskset -c 0 nginx -p "$dir" -c "$dir/nginx.conf" > "$out" &
    P=$!; wait_port "$3"
    # The master listens before it forks its worker: wait for the worker.
    for _ in $(seq 100); do PID=$(pgrep -P "$P") && break; sleep 0.05; done
  fi
}

# us CPU_TICKS WRK_OUTPUT: CPU microseconds a request.
us() { awk -v t="$1" -v n="$(awk '/requests in/ {print $1}' <<< "$2")" -v k="$TICK" 'BEGIN { printf "%.3f", t * 1e6 / k / n }'; }

# pair PROXY SINK_A SINK_B: both at once (which starts first alternates
# from one pair to the next); prints "pair PROXY-SINK_B us_a us_b".
pair() {
  local pa pb pida pidb a0 b0 a1 b1 wa wb pxa pxb
  pxa=$(port); pxb=$(port)
  PAIRS=$((PAIRS + 1))
  if [ $((PAIRS % 2)) = 1 ]; then
    start "$1" "$2" "$pxa" 1; pa=$P; pida=$PID
    start "$1" "$3" "$pxb" 2; pb=$P; pidb=$PID
  else
    start "$1" "$3" "$pxb" 2; pb=$P; pidb=$PID
    start "$1" "$2" "$pxa" 1; pa=$P; pida=$PID
  fi
  a0=$(cpu_ticks "$pida"); b0=$(cpu_ticks "$pidb")
  taskset -c 1 wrk -t1 -c32 -d"${D}s" "http://127.0.0.1:$pxa/" > "$WORK/wrk-a" & wa=$!
  taskset -c 1 wrk -t1 -c32 -d"${D}s" "http://127.0.0.1:$pxb/" > "$WORK/wrk-b" & wb=$!
  wait "$wa" "$wb"
  a1=$(cpu_ticks "$pida"); b1=$(cpu_ticks "$pidb")
  kill "$pa" "$pb"; wait "$pa" "$pb" 2>/dev/null || true
  echo "pair $1-$3 $(us $((a1 - a0)) "$(cat "$WORK/wrk-a")") $(us $((b1 - b0)) "$(cat "$WORK/wrk-b")")"
}

# alone PROXY SINK: prints "alone PROXY-SINK us".
alone() {
  local px a0 a1 out
  px=$(port)
  start "$1" "$2" "$px" 1
  a0=$(cpu_ticks "$PID")
  out=$(taskset -c 1 wrk -t2 -c64 -d"${D}s" "http://127.0.0.1:$px/")
  a1=$(cpu_ticks "$PID")
  kill "$P"; wait "$P" 2>/dev/null || true
  echo "alone $1-$2 $(us $((a1 - a0)) "$out")"
}

for _ in $(seq "$ROUNDS"); do
  for proxy in ratewarden nginx; do
    if [ -n "${SEQUENTIAL:-}" ]; then
      for sink in off file null pipe; do alone $proxy $sink; done
    else
      for sink in off file null pipe; do pair $proxy off $sink; done
    fi
  done
done | awk '
  $1 == "alone" { print; s[$2] += $3; m[$2]++ }
  $1 == "pair" { r = $4 / $3; printf "%-16s %7.3f us beside log off %7.3f us  ratio %.4f\n", $2, $4, $3, r
    if (!($2 in lo) || r < lo[$2]) lo[$2] = r; if (r > hi[$2]) hi[$2] = r; s[$2] += r; m[$2]++ }
  END {
    for (b in s) {
      if (b in lo) printf "mean %-16s ratio to log off beside it %.3f (lowest %.3f, highest %.3f, %d pairs)\n", b, s[b] / m[b], lo[b], hi[b], m[b]
      else { split(b, p, "-"); printf "mean %-16s %7.3f us CPU/req  %.3f x its log off\n", b, s[b] / m[b], s[b] / s[p[1] "-off"] }
    }
  }'
