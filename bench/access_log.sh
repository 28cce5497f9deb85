#!/usr/bin/env bash
# What the JSON access log costs, ratewarden's beside nginx's, in one run.
#
#   bash bench/access_log.sh [ROUNDS]   # ROUNDS=8, D=5 (seconds a run)
#
# Each round runs, in turn, ratewarden (--workers 1, a gcra rule never
# reached) and nginx (worker_processes 1, proxy_pass to a kept-alive
# upstream) with no access log, with a JSON access log to a file, and with
# it to /dev/null. The proxy is pinned to CPU 0; an nginx `return 200`
# origin and `wrk -t2 -c64` are on CPU 1. Prints each run's CPU per request
# (user + system of the proxy's process, every thread, from /proc/PID/stat
# over the wrk run, divided by the requests wrk completed), then each
# configuration's mean and its ratio to the same proxy's log-off mean.
#
# nginx's line carries the same fields as ratewarden's (`escape=json`,
# `buffer=64k flush=1s`, as ratewarden's per-thread batches of 64 KiB).
# The file is in a temporary directory (on the disk /tmp is on), truncated
# before each run. Everything on 127.0.0.1, bounded by D, stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-8}; D=${D:-5}
cargo build --release --bin ratewarden -q
BIN=${BIN:-$PWD/target/release/ratewarden}
. bench/lib.sh
install_missing nginx:nginx-light wrk:wrk
UP=$(port); PX=$(port)
origin_conf "$WORK/origin" "$UP"
taskset -c 1 nginx -p "$WORK/origin" -c "$WORK/origin/nginx.conf" & PIDS+=($!)
wait_port "$UP"
LOG=$WORK/access.log
for sink in off file null; do
  case $sink in off) to="" ;; file) to=$LOG ;; null) to=/dev/null ;; esac
  {
    echo "admin: null"
    [ -n "$to" ] && echo "access_log: {path: $to, format: json}"
    printf 'rules:\n  - {name: open, algorithm: gcra, limit: 1000000, window: 1s}\n'
  } > "$WORK/rw-$sink.yaml"
  if [ -n "$to" ]; then
    ngx_log="log_format line escape=json '{\"time\":\"\$time_iso8601\",\"remote_addr\":\"\$remote_addr\",\"method\":\"\$request_method\",\"target\":\"\$request_uri\",\"protocol\":\"\$server_protocol\",\"status\":\$status,\"bytes\":\$body_bytes_sent,\"duration_ms\":\$request_time,\"request_id\":\"\$request_id\",\"referer\":\"\$http_referer\",\"user_agent\":\"\$http_user_agent\"}';
      access_log $to line buffer=64k flush=1s;"
  else
    ngx_log="access_log off;"
  fi
  mkdir -p "$WORK/ngx-$sink/logs"
  cat > "$WORK/ngx-$sink/nginx.conf" <<NGINX
worker_processes 1;
error_log $WORK/ngx-$sink/logs/error.log crit;
pid $WORK/ngx-$sink/nginx.pid;
daemon off;
events { worker_connections 4096; }
http { $ngx_log
  $(ngx_upstream "$UP")
  $(ngx_proxy "$PX") }
NGINX
done
TICK=$(getconf CLK_TCK)
# run PROXY SINK: one run; prints "PROXY-SINK us".
run() {
  local p pid
  : > "$LOG"
  if [ "$1" = ratewarden ]; then
    RUST_LOG=off taskset -c 0 "$BIN" serve -c "$WORK/rw-$2.yaml" --listen 127.0.0.1:$PX --upstream http://127.0.0.1:$UP --workers 1 > /dev/null &
    p=$!; pid=$p
    wait_port "$PX"
  else
    taskset -c 0 nginx -p "$WORK/ngx-$2" -c "$WORK/ngx-$2/nginx.conf" &
    p=$!
    wait_port "$PX"
    pid=$(pgrep -P "$p")
  fi
  local t0 t1 out n
  t0=$(awk '{print $14 + $15}' /proc/$pid/stat)
  out=$(taskset -c 1 wrk -t2 -c64 -d${D}s http://127.0.0.1:$PX/)
  t1=$(awk '{print $14 + $15}' /proc/$pid/stat)
  kill $p; wait $p 2>/dev/null || true
  n=$(awk '/requests in/ {print $1}' <<< "$out")
  awk -v b="$1-$2" -v t="$((t1 - t0))" -v n="$n" -v k="$TICK" 'BEGIN { printf "%-16s %7.3f us CPU/req\n", b, t * 1e6 / k / n }'
}
for _ in $(seq "$ROUNDS"); do
  for proxy in ratewarden nginx; do
    for sink in off file null; do run $proxy $sink; done
  done
done | awk '{ print; s[$1] += $2; m[$1]++ }
  END {
    for (b in s) mean[b] = s[b] / m[b]
    for (b in s) { split(b, p, "-"); printf "mean %-16s %7.3f us CPU/req  %.3f x its log off\n", b, mean[b], mean[b] / mean[p[1] "-off"] }
  }'
